package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxBlockLen bounds a block CopyBlocks accepts (a packet block of the
// largest snap length with its options, or a large secrets block).
const maxBlockLen = 64 << 20

// CopyStats says what CopyBlocks copied.
type CopyStats struct {
	Blocks  int
	Packets int
	// Truncated: src ended inside a block (a file whose writer was
	// killed); what came before it was copied.
	Truncated bool
}

// CopyBlocks copies a little-endian pcapng stream from src to dst block
// by block, each block's two length fields checked, and stops at the end
// of the last whole block: a file cut short by a crash is exported as the
// valid pcapng it holds. The first block must be a section header.
func CopyBlocks(dst io.Writer, src io.Reader) (CopyStats, error) {
	st, err := copyBlocks(dst, src)
	if err == nil && st.Blocks == 0 {
		return st, errors.New("capture: no whole pcapng block")
	}
	return st, err
}

func copyBlocks(dst io.Writer, src io.Reader) (CopyStats, error) {
	var st CopyStats
	var hdr [8]byte
	buf := make([]byte, 0, 64<<10)
	for {
		_, err := io.ReadFull(src, hdr[:])
		if err == io.EOF {
			return st, nil
		}
		if err == io.ErrUnexpectedEOF {
			st.Truncated = true
			return st, nil
		}
		if err != nil {
			return st, fmt.Errorf("capture: read pcapng: %w", err)
		}
		typ := binary.LittleEndian.Uint32(hdr[0:4])
		l := binary.LittleEndian.Uint32(hdr[4:8])
		if st.Blocks == 0 && typ != blockSHB {
			return st, errors.New("capture: not a pcapng file")
		}
		if l < 12 || l%4 != 0 || l > maxBlockLen {
			if st.Blocks == 0 {
				return st, fmt.Errorf("capture: first block length %d is invalid", l)
			}
			st.Truncated = true
			return st, nil
		}
		if st.Blocks == 0 {
			// Only the little-endian form carbd writes.
			if l < 28 {
				return st, fmt.Errorf("capture: section header length %d is invalid", l)
			}
		}
		buf = append(buf[:0], hdr[:]...)
		buf = append(buf, make([]byte, l-8)...)
		if _, err := io.ReadFull(src, buf[8:]); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				st.Truncated = true
				return st, nil
			}
			return st, fmt.Errorf("capture: read pcapng: %w", err)
		}
		if typ == blockSHB && binary.LittleEndian.Uint32(buf[8:12]) != byteOrderMagic {
			return st, errors.New("capture: pcapng section is not little-endian")
		}
		if binary.LittleEndian.Uint32(buf[l-4:]) != l {
			st.Truncated = true
			return st, nil
		}
		if _, err := dst.Write(buf); err != nil {
			return st, err
		}
		st.Blocks++
		if typ == blockEPB {
			st.Packets++
		}
	}
}
