//go:build !linux

package intercept

import "net"

type chunkReader struct{ c net.Conn }

func newChunkReader(c net.Conn) *chunkReader { return &chunkReader{c: c} }

func (r *chunkReader) next(use func([]byte) error) error { return plainNext(r.c, use) }
