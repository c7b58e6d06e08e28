// Package netparse turns the raw IP packets that the NFQUEUE verdict loop
// receives (starting at the IPv4 or IPv6 header, no link layer) into
// effects and decide.Events for carbd's network channel.
//
// # What it parses
//
//   - IP: IPv4 (options other than NOP/EOL are refused), IPv6 with its
//     extension header chain (hop-by-hop, destination options, routing with
//     no segments left, fragment), fragment reassembly with bounded memory
//     and overlap refusal (RFC 5722, applied to IPv4 too).
//   - TCP: the client-to-server byte stream of each flow, from the SYN, with
//     out-of-order and retransmitted segments; a retransmission that carries
//     different bytes is an attack and refuses the flow.
//   - On the stream: HTTP/1.x requests (each request of a kept-alive or
//     pipelined connection is its own effect with the TCP sequence range it
//     covers), TLS ClientHello (SNI, ALPN, version; the rest is opaque), DNS
//     over TCP, otherwise an opaque stream.
//   - Every stream parser is segmentation-invariant: however the guest
//     cuts, reorders or retransmits a stream (within what the reassembler
//     accepts), the effects and their byte ranges are those of the whole
//     stream (docs/fuzzing.md). HTTP/1.x framing is the sub-package
//     http1, shared with respwatch; RequestStream runs the same request
//     framer on a plain byte stream (an intercepting proxy's decrypted
//     client bytes).
//   - UDP: DNS queries, QUIC v1/v2 Initial packets (decrypted with the
//     Initial keys to read the ClientHello), other datagrams.
//   - ICMP and ICMPv6: echo id, sequence and payload.
//   - DNS responses (ParseDNSAnswer) so that carbd can map addresses to the
//     names the guest resolved.
//
// Decoding uses gopacket's layers with a DecodingLayerParser; a data
// packet of an existing TCP flow and a DNS query decode and classify with
// no allocation. Effects hold views into the packet and into the parser's
// buffers, valid until the next call to Feed or Expire; Effect.Event
// copies what it needs.
//
// # Requirements
//
// Pure Go, no cgo, no root, no kernel interface: the parser is a function
// of the packets and of the times passed in (it never reads the clock).
//
// # Tests
//
// Table-driven tests with synthetic packets (built with gopacket's
// serializer) cover the edge cases: out-of-order, retransmitted and
// conflicting segments, pipelined requests, chunked bodies, oversized
// heads, truncated packets, IPv6 extension headers, fragments. QUIC is
// tested against the RFC 9001 and RFC 9369 Appendix A vectors. Real
// traffic (curl against an HTTP server, dig against a DNS responder, Go's
// crypto/tls client, ping) is captured inside a private network namespace
// when the tests run as root; the captures kept under testdata/ replay
// the same assertions without root. Fuzz targets keep their corpus under
// testdata/fuzz/. See docs/netparse.md.
package netparse
