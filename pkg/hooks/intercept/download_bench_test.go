package intercept

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
)

// dlMiB is the size of one download of BenchmarkDownloadCPU.
const dlMiB = 32

// BenchmarkDownloadCPU: the process's CPU time per MiB of a download
// (client, world and, through carbd, the proxy), one download per op,
// with -benchmem its allocations: carbd's own part per MiB is
// carbd's cpu-µs/MiB minus direct's. tls-pair is the floor of what
// carbd adds: a crypto/tls server writing to a crypto/tls client over
// loopback TCP (one encryption, one decryption, one TCP hop per byte),
// the bytes of an HTTP download with no HTTP. make bench reports it
// (docs/interception.md, "Issue 13: downloads").
func BenchmarkDownloadCPU(b *testing.B) {
	env := newBenchEnvWith(b, false)
	b.Run("tls-pair", func(b *testing.B) { tlsPair(b, env.w) })
	for _, h2 := range []bool{false, true} {
		for _, v := range env.vias {
			b.Run(fmt.Sprintf("%s/%s", map[bool]string{false: "h1", true: "h2"}[h2], v.name), func(b *testing.B) {
				c := v.client(h2, true)
				defer c.CloseIdleConnections()
				url := fmt.Sprintf("%s/big?n=%d", v.base, dlMiB<<20)
				if err := get(c, url, dlMiB<<20); err != nil { // connection up, buffers grown
					b.Fatal(err)
				}
				b.SetBytes(dlMiB << 20)
				c0 := cpuTime()
				for b.Loop() {
					if err := get(c, url, dlMiB<<20); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(us(cpuTime()-c0)/float64(b.N*dlMiB), "cpu-µs/MiB")
			})
		}
	}
}

// tlsPair streams dlMiB MiB per op from a crypto/tls server to a
// crypto/tls client over loopback, in the world's 64 KiB writes.
func tlsPair(b *testing.B, w *world) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	certs := w.certs
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			return
		}
		s := tls.Server(raw, &tls.Config{Certificates: certs})
		defer s.Close()
		chunk := make([]byte, 64<<10)
		var one [1]byte
		for {
			if _, err := io.ReadFull(s, one[:]); err != nil { // one byte asks for one download
				return
			}
			for n := 0; n < dlMiB<<20; n += len(chunk) {
				if _, err := s.Write(chunk); err != nil {
					return
				}
			}
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "localhost", RootCAs: newPoolFromFile(b, w.caFile)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 32<<10) // what net/http's body reads ask for
	download := func() {
		if _, err := c.Write([]byte{1}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.CopyBuffer(io.Discard, io.LimitReader(c, dlMiB<<20), buf); err != nil {
			b.Fatal(err)
		}
	}
	download()
	b.SetBytes(dlMiB << 20)
	c0 := cpuTime()
	for b.Loop() {
		download()
	}
	b.ReportMetric(us(cpuTime()-c0)/float64(b.N*dlMiB), "cpu-µs/MiB")
}
