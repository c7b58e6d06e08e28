package http1

import "fmt"

// Chunked decodes a chunked body (RFC 9112 §7.1) as its bytes arrive, in
// calls cut anywhere. It reads byte by byte outside chunk data (O(1) work
// per byte, no line buffer), so its outcome is a function of the bytes
// alone; the bounds stop it at an exact byte.
//
// The zero value is ready, strict (CRLF line ends, no blanks before a
// chunk extension) and unbounded but for MaxLine's default; set the
// fields before the first call.
type Chunked struct {
	// Lax accepts a bare LF as a line end and blanks before a chunk
	// extension, as HTTP clients do with responses; a parser deciding
	// requests leaves it false.
	Lax bool
	// MaxLine bounds a chunk-size line (extensions included, line end
	// excluded); 0 means 1024.
	MaxLine int
	// MaxData and MaxWire, when positive, stop decoding with Over once
	// more data bytes, or more body bytes on the wire, than they allow
	// were consumed: Decoded is then at most MaxData+1, Wire at most
	// MaxWire+1.
	MaxData, MaxWire int64
	// MaxTrailer, when positive, bounds the trailer section (its bytes,
	// line ends included, the final empty line excluded): more is an
	// error.
	MaxTrailer int64

	// Decoded is the data bytes consumed so far; Wire the body bytes.
	Decoded, Wire int64
	// TrailerAt is the wire offset where the trailer section starts, -1
	// until the last chunk was read (its value is meaningless before the
	// first call: check Trailer()).
	TrailerAt int64

	st      cstate
	digits  int   // hex digits of the current size line
	size    int64 // the current chunk's size
	remain  int64 // data bytes left in the current chunk
	line    int   // bytes of the current size line
	trailer int64 // bytes of the trailer section
}

type cstate uint8

const (
	cSize       cstate = iota // hex digits of a size line
	cSizeBWS                  // blanks after the digits (Lax)
	cExt                      // a chunk extension
	cSizeLF                   // the LF after the CR of a size line
	cData                     // chunk data
	cDataCR                   // the CR after chunk data
	cDataLF                   // the LF after that CR
	cTrailStart               // the start of a trailer line or of the final empty line
	cTrailName                // a trailer field name
	cTrailValue               // a trailer field value
	cTrailLF                  // the LF after a trailer line's CR
	cEndLF                    // the LF of the final empty line
	cDone                     // the body is complete
	cOver                     // a bound was passed
	cBad                      // an error was returned
)

// ChunkStatus says what Next's bytes did.
type ChunkStatus uint8

const (
	ChunkMore ChunkStatus = iota // all bytes consumed (or a data run returned); more are needed
	ChunkDone                    // the body ended with the n bytes consumed
	ChunkOver                    // a bound (MaxData, MaxWire) was passed; decoding stopped
)

// Done reports whether the body is complete.
func (c *Chunked) Done() bool { return c.st == cDone }

// Over reports whether decoding stopped at a bound.
func (c *Chunked) Over() bool { return c.st == cOver }

// Trailer reports whether the last chunk was read (TrailerAt is set).
func (c *Chunked) Trailer() bool { return c.st >= cTrailStart && c.st <= cDone }

// InData reports whether the decoder is inside a chunk's data, and how
// many data bytes of that chunk are left.
func (c *Chunked) InData() (bool, int64) { return c.st == cData, c.remain }

// LoseData accounts for n data bytes of the current chunk that will never
// be seen (a hole in a capture): it reports false, changing nothing, when
// the decoder is not inside chunk data or n passes the chunk's end.
func (c *Chunked) LoseData(n int64) bool {
	if c.st != cData || n > c.remain {
		return false
	}
	c.remain -= n
	c.Decoded += n
	c.Wire += n
	if c.remain == 0 {
		c.st = cDataCR
	}
	return true
}

func (c *Chunked) fail(format string, a ...any) error {
	c.st = cBad
	return fmt.Errorf("%w: "+format, append([]any{ErrSyntax}, a...)...)
}

// Next consumes bytes from b. It returns how many it consumed and, when
// some of them are chunk data, that data (a view into b): it returns
// after each run of data, so call it again with b[n:] while n < len(b)
// and the status is ChunkMore. After ChunkDone, ChunkOver or an error it
// consumes nothing more.
func (c *Chunked) Next(b []byte) (n int, data []byte, st ChunkStatus, err error) {
	maxLine := c.MaxLine
	if maxLine <= 0 {
		maxLine = 1024
	}
	for n < len(b) {
		switch c.st {
		case cDone:
			return n, nil, ChunkDone, nil
		case cOver:
			return n, nil, ChunkOver, nil
		case cBad:
			return n, nil, ChunkMore, fmt.Errorf("%w: chunked body after an error", ErrSyntax)
		case cData:
			k := min(int64(len(b)-n), c.remain)
			if c.MaxData > 0 {
				k = min(k, c.MaxData+1-c.Decoded)
			}
			if c.MaxWire > 0 {
				k = min(k, c.MaxWire+1-c.Wire)
			}
			data = b[n : n+int(k)]
			n += int(k)
			c.remain -= k
			c.Decoded += k
			c.Wire += k
			if c.remain == 0 {
				c.st = cDataCR
			}
			if c.over() {
				return n, data, ChunkOver, nil
			}
			return n, data, ChunkMore, nil
		}
		ch := b[n]
		n++
		c.Wire++
		if err := c.step(ch, maxLine); err != nil {
			return n, nil, ChunkMore, err
		}
		if c.st == cDone {
			return n, nil, ChunkDone, nil
		}
		if c.over() {
			return n, nil, ChunkOver, nil
		}
	}
	switch c.st {
	case cDone:
		return n, nil, ChunkDone, nil
	case cOver:
		return n, nil, ChunkOver, nil
	}
	return n, nil, ChunkMore, nil
}

func (c *Chunked) over() bool {
	if c.MaxData > 0 && c.Decoded > c.MaxData || c.MaxWire > 0 && c.Wire > c.MaxWire {
		c.st = cOver
		return true
	}
	return false
}

// step reads one byte outside chunk data.
func (c *Chunked) step(ch byte, maxLine int) error {
	switch c.st {
	case cSize, cSizeBWS, cExt:
		if ch != '\n' {
			if c.line++; c.line > maxLine {
				return c.fail("chunk size line longer than %d bytes", maxLine)
			}
		}
	}
	switch c.st {
	case cSize:
		if v := Unhex(ch); v >= 0 {
			if c.digits >= 15 {
				return c.fail("chunk size too long")
			}
			c.digits++
			c.size = c.size<<4 | int64(v)
			return nil
		}
		if c.digits == 0 {
			return c.fail("chunk size line starts with %q", ch)
		}
		return c.afterSize(ch)
	case cSizeBWS:
		if ch == ' ' || ch == '\t' {
			return nil
		}
		return c.afterSize(ch)
	case cExt:
		switch {
		case ch == '\r':
			c.st = cSizeLF
		case ch == '\n' && c.Lax:
			c.endSizeLine()
		case isCTL(ch):
			return c.fail("control byte %#x in a chunk extension", ch)
		}
		return nil
	case cSizeLF:
		if ch != '\n' {
			return c.fail("chunk size line not ended by CRLF")
		}
		c.endSizeLine()
		return nil
	case cDataCR:
		switch {
		case ch == '\r':
			c.st = cDataLF
		case ch == '\n' && c.Lax:
			c.st = cSize
		default:
			return c.fail("chunk data not followed by CRLF")
		}
		return nil
	case cDataLF:
		if ch != '\n' {
			return c.fail("chunk data not followed by CRLF")
		}
		c.st = cSize
		return nil
	}
	// The trailer section.
	if c.trailer++; c.MaxTrailer > 0 && c.trailer > c.MaxTrailer {
		return c.fail("trailer section longer than %d bytes", c.MaxTrailer)
	}
	switch c.st {
	case cTrailStart:
		switch {
		case ch == '\r':
			c.st = cEndLF
		case ch == '\n' && c.Lax:
			c.st = cDone
		case tchar[ch]:
			c.st = cTrailName
		case ch == ' ' || ch == '\t':
			return c.fail("obsolete line folding in the trailer section")
		default:
			return c.fail("trailer line starts with %q", ch)
		}
	case cTrailName:
		switch {
		case ch == ':':
			c.st = cTrailValue
		case !tchar[ch]:
			return c.fail("trailer field name holds %q", ch)
		}
	case cTrailValue:
		switch {
		case ch == '\r':
			c.st = cTrailLF
		case ch == '\n' && c.Lax:
			c.st = cTrailStart
		case isCTL(ch):
			return c.fail("control byte %#x in a trailer field", ch)
		}
	case cTrailLF:
		if ch != '\n' {
			return c.fail("trailer line not ended by CRLF")
		}
		c.st = cTrailStart
	case cEndLF:
		if ch != '\n' {
			return c.fail("trailer section not ended by CRLF")
		}
		c.st = cDone
	}
	return nil
}

// afterSize reads the byte after a chunk size's digits.
func (c *Chunked) afterSize(ch byte) error {
	switch {
	case ch == ';':
		c.st = cExt
	case ch == '\r':
		c.st = cSizeLF
	case ch == '\n' && c.Lax:
		c.endSizeLine()
	case (ch == ' ' || ch == '\t') && c.Lax:
		c.st = cSizeBWS
	default:
		return c.fail("chunk size followed by %q", ch)
	}
	return nil
}

// endSizeLine starts the chunk's data, or the trailer section after the
// last chunk.
func (c *Chunked) endSizeLine() {
	size := c.size
	c.digits, c.size, c.line = 0, 0, 0
	if size == 0 {
		c.st, c.TrailerAt = cTrailStart, c.Wire
		return
	}
	c.st, c.remain = cData, size
}
