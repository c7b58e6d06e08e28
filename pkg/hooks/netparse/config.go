package netparse

import (
	"fmt"
	"time"
)

// Config bounds the parser's memory and says how long it waits. The zero
// value of a field selects its default; negative values are invalid.
type Config struct {
	// MaxHeaderBytes bounds an HTTP request head, a TLS ClientHello and a
	// DNS-over-TCP message. Default 64 KiB.
	MaxHeaderBytes int
	// MaxBodyBytes bounds the HTTP request body carbd reads (after
	// dechunking). A longer body makes the request oversized: it is
	// decided with the first MaxBodyBytes as content and marked opaque.
	// Default 256 KiB.
	MaxBodyBytes int
	// MaxOpaqueBytes bounds the content kept from an opaque stream or
	// datagram. Default 4 KiB.
	MaxOpaqueBytes int
	// RetainBytes is how many bytes of already-decided requests a flow
	// keeps to compare retransmissions with. A retransmission of older
	// bytes is dropped. Default 64 KiB.
	RetainBytes int
	// MaxFlows bounds the TCP flows (and QUIC 4-tuples) tracked. New flows
	// beyond it are refused. Default 16384.
	MaxFlows int
	// MaxStreamBytes bounds the bytes buffered by all TCP flows together.
	// Segments that would exceed it are dropped (the guest retransmits).
	// Default 128 MiB.
	MaxStreamBytes int
	// FlowIdle is how long a flow with no packets is kept. Default 5 min.
	FlowIdle time.Duration
	// PendingTimeout is how long undecided bytes wait for the rest of
	// their request before Expire decides what is there. Default 2 s.
	PendingTimeout time.Duration
	// MaxFragDatagrams bounds the datagrams under reassembly. Default 256.
	MaxFragDatagrams int
	// MaxFragBytes bounds the bytes held by fragment reassembly. Default 4 MiB.
	MaxFragBytes int
	// MaxFragments bounds the fragments of one datagram. Default 64.
	MaxFragments int
	// FragTimeout is how long an incomplete datagram waits. Default 30 s.
	FragTimeout time.Duration
	// IgnoreChecksums skips the TCP, UDP and ICMP checksum checks (the
	// IPv4 header checksum is always checked). Meta.ChecksumNotReady skips
	// them for one packet.
	IgnoreChecksums bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxHeaderBytes:   64 << 10,
		MaxBodyBytes:     256 << 10,
		MaxOpaqueBytes:   4 << 10,
		RetainBytes:      64 << 10,
		MaxFlows:         16384,
		MaxStreamBytes:   128 << 20,
		FlowIdle:         5 * time.Minute,
		PendingTimeout:   2 * time.Second,
		MaxFragDatagrams: 256,
		MaxFragBytes:     4 << 20,
		MaxFragments:     64,
		FragTimeout:      30 * time.Second,
	}
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxHeaderBytes", &c.MaxHeaderBytes, d.MaxHeaderBytes},
		{"MaxBodyBytes", &c.MaxBodyBytes, d.MaxBodyBytes},
		{"MaxOpaqueBytes", &c.MaxOpaqueBytes, d.MaxOpaqueBytes},
		{"RetainBytes", &c.RetainBytes, d.RetainBytes},
		{"MaxFlows", &c.MaxFlows, d.MaxFlows},
		{"MaxStreamBytes", &c.MaxStreamBytes, d.MaxStreamBytes},
		{"MaxFragDatagrams", &c.MaxFragDatagrams, d.MaxFragDatagrams},
		{"MaxFragBytes", &c.MaxFragBytes, d.MaxFragBytes},
		{"MaxFragments", &c.MaxFragments, d.MaxFragments},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return c, fmt.Errorf("netparse: config %s is negative (%d)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"FlowIdle", &c.FlowIdle, d.FlowIdle},
		{"PendingTimeout", &c.PendingTimeout, d.PendingTimeout},
		{"FragTimeout", &c.FragTimeout, d.FragTimeout},
	}
	for _, f := range durs {
		if *f.v < 0 {
			return c, fmt.Errorf("netparse: config %s is negative (%s)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.MaxHeaderBytes < 1024 {
		return c, fmt.Errorf("netparse: config MaxHeaderBytes %d is below 1024", c.MaxHeaderBytes)
	}
	if c.MaxHeaderBytes > 1<<24 || c.MaxBodyBytes > 1<<30 {
		return c, fmt.Errorf("netparse: config MaxHeaderBytes/MaxBodyBytes too large (%d/%d)", c.MaxHeaderBytes, c.MaxBodyBytes)
	}
	return c, nil
}
