package intercept

import (
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkPassRelay: the relay of a passed connection alone, without
// TLS: a TCP server on loopback writes 64 MiB in TLS-record-sized
// writes (16406 bytes), read by a client directly (direct), through a
// relay that io.Copy's between the two TCP sockets (splice: splice(2)
// through a pipe, what the Front did before issue 13), and through
// relay (chunks: what it does now). One op is one download of each, in
// turn; each variant's MB/s and the process's CPU time per MiB, and the
// relays' CPU against direct. Not in the report (docs/interception.md,
// "Issue 13: downloads").
func BenchmarkPassRelay(b *testing.B) {
	const size, write = 64 << 20, 16406
	src, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	go func() {
		buf := make([]byte, write)
		for {
			c, err := src.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for n := 0; n < size; n += write {
					if _, err := c.Write(buf[:min(write, size-n)]); err != nil {
						return
					}
				}
			}()
		}
	}()
	relayed := func(copyFn func(c, u net.Conn)) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					u, err := net.Dial("tcp", src.Addr().String())
					if err != nil {
						return
					}
					defer u.Close()
					copyFn(c, u)
				}()
			}
		}()
		return ln
	}
	splice := relayed(func(c, u net.Conn) { io.Copy(c, u) }) //nolint:errcheck // the client counts the bytes
	defer splice.Close()
	chunks := relayed(func(c, u net.Conn) { relay(c, u, nil) }) //nolint:errcheck // the client counts the bytes
	defer chunks.Close()
	vars := []struct {
		name string
		addr string
	}{{"direct", src.Addr().String()}, {"splice", splice.Addr().String()}, {"chunks", chunks.Addr().String()}}
	wall := map[string]time.Duration{}
	cpu := map[string]time.Duration{}
	buf := make([]byte, 32<<10)
	for i := 0; b.Loop(); i++ {
		for k := range vars {
			v := vars[(i+k)%len(vars)]
			t0, c0 := time.Now(), cpuTime()
			c, err := net.Dial("tcp", v.addr)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, buf)
			c.Close()
			if err != nil || n != size {
				b.Fatalf("%s: %d bytes, %v", v.name, n, err)
			}
			wall[v.name] += time.Since(t0)
			cpu[v.name] += cpuTime() - c0
		}
	}
	mib := float64(b.N) * size / (1 << 20)
	for _, v := range vars {
		b.ReportMetric(mib*(1<<20)/1e6/wall[v.name].Seconds(), v.name+"-MB/s")
		b.ReportMetric(us(cpu[v.name])/mib, v.name+"-cpu-µs/MiB")
	}
	if cpu["direct"] > 0 {
		b.ReportMetric(cpu["splice"].Seconds()/cpu["direct"].Seconds(), "splice/direct-cpu")
		b.ReportMetric(cpu["chunks"].Seconds()/cpu["direct"].Seconds(), "chunks/direct-cpu")
	}
}
