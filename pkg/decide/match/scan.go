package match

import (
	"encoding/binary"
	"math/bits"
)

// Scan buffer sizes: content is normalised block by block into a buffer
// on the stack, never into a copy of the whole content.
const (
	blockSize      = 8 << 10
	smallBlockSize = 512
	tinyBlockSize  = 64 // a host, a path, a short body: little stack to clear
	bufSlack       = 64 // room past the block for normFill's stores
)

// ScanFunc calls fn once for every token of the index that occurs in
// Norm(content), at its first occurrence, in order of that occurrence,
// until fn returns false. Normalisation is fused into the scan: content is
// never copied as a whole.
func (x *Index) ScanFunc(content string, fn func(Hit) bool) {
	if len(x.toks) == 0 || content == "" {
		return
	}
	if len(content) < tinyBlockSize {
		var buf [tinyBlockSize + bufSlack]byte
		var cand [(tinyBlockSize+bufSlack)/stride + 1]uint32
		sc := scanner{x: x, s: content, buf: buf[:], candBuf: cand[:], block: tinyBlockSize, id: -1}
		x.scanFunc(&sc, fn)
		return
	}
	if len(content) < smallBlockSize {
		var buf [smallBlockSize + bufSlack]byte
		var cand [(smallBlockSize+bufSlack)/stride + 1]uint32
		sc := scanner{x: x, s: content, buf: buf[:], candBuf: cand[:], block: smallBlockSize, id: -1}
		x.scanFunc(&sc, fn)
		return
	}
	var buf [blockSize + bufSlack]byte
	var cand [(blockSize+bufSlack)/stride + 1]uint32
	sc := scanner{x: x, s: content, buf: buf[:], candBuf: cand[:], block: blockSize, id: -1}
	x.scanFunc(&sc, fn)
}

func (x *Index) scanFunc(sc *scanner, fn func(Hit) bool) {
	var seen []int32
	var seenSet map[int32]struct{}
	for {
		id, abs, ok := sc.next()
		if !ok {
			return
		}
		if x.byText[x.toks[id]] != id {
			continue // shadowed by a newer record at a higher level
		}
		if seenSet != nil {
			if _, ok := seenSet[id]; ok {
				continue
			}
			seenSet[id] = struct{}{}
		} else {
			dup := false
			for _, s := range seen {
				dup = dup || s == id
			}
			if dup {
				continue
			}
			seen = append(seen, id)
			if len(seen) > 32 {
				seenSet = make(map[int32]struct{}, 2*len(seen))
				for _, s := range seen {
					seenSet[s] = struct{}{}
				}
			}
		}
		if !fn(Hit{Token: x.toks[id], Level: x.levels[id], Origin: x.origin[id], Offset: sc.rawOffset(abs)}) {
			return
		}
	}
}

// Scan returns the join (maximum) of the levels of the tokens that occur
// in Norm(content), and one Hit per such token, in order of first
// occurrence. max is 0 when there is no hit.
func (x *Index) Scan(content string) (max uint8, hits []Hit) {
	x.ScanFunc(content, func(h Hit) bool {
		if h.Level > max || len(hits) == 0 {
			max = h.Level
		}
		hits = append(hits, h)
		return true
	})
	return max, hits
}

// MaxLevel returns the highest level of the tokens that occur in
// Norm(content) and whether any does. It stops as soon as it finds a token
// at the index's top level.
func (x *Index) MaxLevel(content string) (uint8, bool) {
	if len(x.toks) == 0 || content == "" {
		return 0, false
	}
	if len(content) < tinyBlockSize {
		return x.maxLevelShort(content)
	}
	if len(content) < smallBlockSize {
		var buf [smallBlockSize + bufSlack]byte
		var cand [(smallBlockSize+bufSlack)/stride + 1]uint32
		sc := scanner{x: x, s: content, buf: buf[:], candBuf: cand[:], block: smallBlockSize, id: -1}
		return x.maxLevel(&sc)
	}
	var buf [blockSize + bufSlack]byte
	var cand [(blockSize+bufSlack)/stride + 1]uint32
	sc := scanner{x: x, s: content, buf: buf[:], candBuf: cand[:], block: blockSize, id: -1}
	return x.maxLevel(&sc)
}

func (x *Index) maxLevel(sc *scanner) (uint8, bool) {
	var lvl uint8
	found := false
	for {
		id, _, ok := sc.next()
		if !ok {
			return lvl, found
		}
		if l := x.levels[id]; !found || l > lvl {
			lvl, found = l, true
			if lvl == x.top {
				return lvl, true
			}
		}
	}
}

// maxLevelShort is MaxLevel for content shorter than tinyBlockSize (a
// host, a path, a short body: most fields of an effect). Its whole normal
// form fits a buffer on the stack (a byte may become three: an invalid
// one is written as U+FFFD), so there is no block to carry over and no
// token that runs past the buffer, and the probes are tried in place.
func (x *Index) maxLevelShort(content string) (uint8, bool) {
	const limit = 3 * tinyBlockSize
	var buf [limit + fillSlack]byte
	n, _ := normFill(buf[:], 0, limit, content, 0)
	var lvl uint8
	found := false
	gbits, gshift, pbits, pshift := x.gbits, x.gshift, x.pbits, x.pshift&63
	for p := 0; p+gramLen <= n; p += stride {
		// A probe reads 8 bytes; those past n are stale and only cause
		// candidates that the exact checks drop.
		g := gramHash(binary.LittleEndian.Uint64(buf[p:]), gshift)
		if gbits[g>>6]>>(g&63)&1 == 0 {
			continue
		}
		for c := max(p-(stride-1), 0); c <= p && c+MinTokenLen <= n; c++ {
			u := binary.LittleEndian.Uint64(buf[c:])
			if f := u * hashP >> pshift; pbits[f>>6]>>(f&63)&1 == 0 {
				continue
			}
			for id := x.heads[u*hashP>>x.hshift]; id >= 0; id = x.next[id] {
				t := x.toks[id]
				if x.pre[id] != u || c+len(t) > n || string(buf[c+MinTokenLen:c+len(t)]) != t[MinTokenLen:] {
					continue
				}
				if l := x.levels[id]; !found || l > lvl {
					lvl, found = l, true
					if lvl == x.top {
						return lvl, true
					}
				}
			}
		}
	}
	return lvl, found
}

// scanner walks the occurrences of the records of an Index in Norm(s),
// normalising s block by block into buf.
//
// Every occurrence of a token t (len(t) >= MinTokenLen) at position p
// covers the q-grams starting at p, ..., p+stride-1 with its first
// MinTokenLen bytes, and exactly one of those starting positions is a
// multiple of stride. So the scan reads only the q-grams at multiples of
// stride (q = 5, stride 4). For each block it
//  1. looks every probed q-gram up in the gram filter, a bitset of the
//     hashes of the q-grams at offsets 0..stride-1 of every token, and
//     lists the probes that hit, without a branch on the data;
//  2. tests the stride candidate starts p-j of each listed probe against
//     the prefix filter (a bitset of the hashes of the tokens' first 8
//     bytes);
//  3. looks the survivors' first 8 bytes up in the prefix table and
//     verifies each record of the chain in full.
type scanner struct {
	x       *Index
	s       string
	buf     []byte
	candBuf []uint32 // one block's probes: position<<8 | offsets
	block   int

	n     int  // bytes of Norm(s) in buf
	base  int  // position in Norm(s) of buf[0]
	i     int  // bytes of s normalised so far
	final bool // buf holds the end of Norm(s)
	begun bool // the first block is filled
	end   int  // last position of buf to probe in this block
	probe int  // next position of buf to probe

	ci, nc int    // next and number of the block's surviving probes in candBuf
	p      int    // position of buf being tried
	m      uint8  // offsets of p left to try
	c      int    // candidate start in buf
	u      uint64 // its first 8 bytes
	id     int32  // next record of its chain to try, or -1

	// Where the current and the previous fill began: a position in
	// Norm(s) and the raw position in s that produced it.
	curAbs, curRaw, prevAbs, prevRaw int
}

// next returns the next occurrence: record id starting at position abs
// of Norm(s). Occurrences come in ascending order of abs, except that
// those of different records at the same abs come in chain order.
func (sc *scanner) next() (id int32, abs int, ok bool) {
	x := sc.x
	for {
		for sc.id >= 0 {
			id := sc.id
			sc.id = x.next[id]
			if x.pre[id] == sc.u && sc.verify(sc.buf[:sc.n], sc.c, x.toks[id]) {
				return id, sc.base + sc.c, true
			}
		}
		if sc.m != 0 {
			// Leftmost candidate first: the highest offset.
			j := 7 - bits.LeadingZeros8(sc.m)
			sc.m &^= 1 << j
			if c := sc.p - j; c >= 0 && c+MinTokenLen <= sc.n {
				sc.c = c
				sc.u = binary.LittleEndian.Uint64(sc.buf[c:])
				sc.id = x.heads[sc.u*hashP>>x.hshift]
			}
			continue
		}
		if sc.ci < sc.nc {
			c := sc.candBuf[sc.ci]
			sc.ci++
			sc.p, sc.m = int(c>>8), uint8(c)
			continue
		}
		if !sc.fill() {
			return 0, 0, false
		}
		sc.collect()
	}
}

// collect lists the probes of the block whose candidates pass both
// filters.
func (sc *scanner) collect() {
	x := sc.x
	b := sc.buf
	cand := sc.candBuf
	if len(b) < sc.end+MinTokenLen+stride || len(cand) < (sc.end-sc.probe)/stride+1 {
		panic("match: scan buffers too small")
	}
	// 1: the gram filter. Every probe is written, the count only grows on
	// a hit: no branch for the predictor to miss.
	nc, p := gramScan(b, x.gbits, x.gshift, cand, sc.probe, sc.end)
	sc.probe = p
	// 2: the prefix filter, for the k candidate starts of each probe that
	// passed. Bytes past the block are stale but inside buf; a stale
	// candidate fails the exact checks later.
	pbits, pshift := x.pbits, x.pshift&63
	k := 0
	for _, c := range cand[:nc] {
		p := int(c >> 8)
		var keep uint8
		for j := range stride {
			u := binary.LittleEndian.Uint64(b[max(p-j, 0):])
			f := u * hashP >> pshift
			keep |= uint8(pbits[f>>6]>>(f&63)&1) << j
		}
		if p < stride-1 {
			keep &= uint8(1)<<(p+1) - 1 // no candidate starts before the content
		}
		cand[k] = c | uint32(keep)
		if keep != 0 {
			k++
		}
	}
	sc.ci, sc.nc = 0, k
}

// gramScan looks up the q-grams at p, p+stride, ... <= end of b in the
// gram filter and writes position<<8 of those it has to cand. It returns
// how many it wrote and the first position it did not probe. b must hold
// 8 bytes from every probed position.
func gramScan(b []byte, gbits []uint64, gshift uint8, cand []uint32, p, end int) (int, int) {
	nc := 0
	// Four probes per round, their grams from three loads (for stride 4:
	// the constants below do not compile otherwise).
	const _, _ uint = stride - 4, 4 - stride
	for ; p+3*stride <= end; p += 4 * stride {
		w := b[p : p+4*stride+4]
		w0 := binary.LittleEndian.Uint64(w[0:])
		w1 := binary.LittleEndian.Uint64(w[8:])
		w2 := binary.LittleEndian.Uint64(w[12:])
		g0 := gramHash(w0, gshift)
		g1 := gramHash(w0>>32|w1<<32, gshift)
		g2 := gramHash(w1, gshift)
		g3 := gramHash(w2, gshift)
		h0 := int(gbits[g0>>6] >> (g0 & 63) & 1)
		h1 := int(gbits[g1>>6] >> (g1 & 63) & 1)
		h2 := int(gbits[g2>>6] >> (g2 & 63) & 1)
		h3 := int(gbits[g3>>6] >> (g3 & 63) & 1)
		cand[nc] = uint32(p) << 8
		nc += h0
		cand[nc] = uint32(p+stride) << 8
		nc += h1
		cand[nc] = uint32(p+2*stride) << 8
		nc += h2
		cand[nc] = uint32(p+3*stride) << 8
		nc += h3
	}
	for ; p <= end; p += stride {
		g := gramHash(binary.LittleEndian.Uint64(b[p:]), gshift)
		cand[nc] = uint32(p) << 8
		nc += int(gbits[g>>6] >> (g & 63) & 1)
	}
	return nc, p
}

// fill moves the unprobed tail of buf to its front and normalises the
// next block of s behind it. It reports false at the end of s.
func (sc *scanner) fill() bool {
	if sc.begun {
		if sc.final {
			return false
		}
		// Keep what the next probe's candidates may start at.
		keep := sc.probe - (stride - 1)
		sc.n = copy(sc.buf, sc.buf[keep:sc.n])
		sc.base += keep
		sc.probe -= keep
	}
	sc.begun = true
	sc.prevAbs, sc.prevRaw = sc.curAbs, sc.curRaw
	sc.curAbs, sc.curRaw = sc.base+sc.n, sc.i
	sc.n, sc.i = normFill(sc.buf, sc.n, sc.block, sc.s, sc.i)
	sc.final = sc.i >= len(sc.s)
	// A probe at p reads b[p:p+4] and, for offset 0, b[p:p+8]; the last
	// block is probed to its end (shorter candidates fail).
	sc.end = sc.n - MinTokenLen
	if sc.final {
		sc.end = sc.n - gramLen
	}
	return true
}

// verify reports whether token t occurs at b[s:], whose first
// MinTokenLen bytes are known to match; a token running past the buffer
// is compared with the content that follows, normalised on the fly.
func (sc *scanner) verify(b []byte, s int, t string) bool {
	rest, avail := t[MinTokenLen:], b[s+MinTokenLen:]
	if len(rest) <= len(avail) {
		return string(avail[:len(rest)]) == rest
	}
	if sc.final || string(avail) != rest[:len(avail)] {
		return false
	}
	return normHasPrefix(sc.s, sc.i, rest[len(avail):])
}

// normHasPrefix reports whether Norm(s[i:]) starts with want.
func normHasPrefix(s string, i int, want string) bool {
	var tmp [64 + fillSlack]byte
	for len(want) > 0 {
		if i >= len(s) {
			return false
		}
		var n int
		n, i = normFill(tmp[:], 0, 64, s, i)
		k := min(n, len(want))
		if string(tmp[:k]) != want[:k] {
			return false
		}
		want = want[k:]
	}
	return true
}

// rawOffset maps a position of Norm(s) in the current or previous fill
// back to the offset in s of the rune that produced it.
func (sc *scanner) rawOffset(abs int) int {
	at, raw := sc.curAbs, sc.curRaw
	if abs < at {
		at, raw = sc.prevAbs, sc.prevRaw
	}
	for raw < len(sc.s) {
		out, size := normRune(sc.s, raw)
		if at+out > abs {
			return raw
		}
		at += out
		raw += size
	}
	return raw
}
