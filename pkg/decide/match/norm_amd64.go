package match

// normTables drives normASCII: for each 8-bit mask of the whitespace
// bytes of an 8-byte half, the pshufb indices of the kept bytes in order
// (0x80 = zero) and how many bytes are kept.
type normTables struct {
	shuf [256]uint64
	keep [256]uint8
}

var (
	normTab = func() *normTables {
		t := new(normTables)
		for m := range 256 {
			var sh uint64 = 0x8080808080808080
			k := 0
			for b := range 8 {
				if m&(1<<b) == 0 {
					sh = sh&^(0xff<<(8*k)) | uint64(b)<<(8*k)
					k++
				}
			}
			t.shuf[m], t.keep[m] = sh, uint8(k)
		}
		return t
	}()
	useSSSE3 = hasSSSE3()
)

// normASCII is implemented in norm_amd64.s.
//
//go:noescape
func normASCII(dst []byte, src string, tab *normTables) (n int, i int)

func hasSSSE3() bool

// normFast normalises a prefix of s into dst, 16 bytes at a time, while
// s is ASCII; see normASCII. It returns the bytes written and consumed.
func normFast(dst []byte, s string) (n, i int) {
	if !useSSSE3 {
		return 0, 0
	}
	return normASCII(dst, s, normTab)
}
