//go:build !amd64

package match

// useSSSE3 is always false here: there is no vector kernel on this
// architecture, normFill's word loop does the work.
var useSSSE3 = false

func normFast(dst []byte, s string) (n, i int) { return 0, 0 }
