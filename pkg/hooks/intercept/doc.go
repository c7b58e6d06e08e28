// Package intercept is carbd's transparent TLS interception engine: it
// terminates the guest's TLS connections with certificates minted by
// carbd's own CA, connects to the original destination with the host's
// trust, and turns every HTTP request inside into one effect that a
// Decider decides before any of its bytes go upstream.
//
// # What it does
//
//   - CA: an ECDSA P-256 authority created once under a state directory
//     (LoadOrCreateCA: key 0600, files appear by rename under an flock,
//     so two processes starting together agree) or loaded from files
//     (LoadCA). Leaves are minted per SNI, or per address when the
//     client sends no SNI, valid 24 h by default, kept in a bounded LRU.
//   - Handshake order: inside the client's handshake (GetConfigForClient)
//     the proxy connects upstream first, offering the protocols the
//     client offered (h2, http/1.1), verifies the server against the
//     host's roots plus Config.UpstreamCAFiles, and tells the client only
//     the protocol upstream chose: no protocol translation. A failed
//     upstream verification still completes the client's handshake, and
//     every request is answered 403 with the reason.
//   - HTTP/1.x: the decrypted client stream is framed by netparse's
//     RequestStream (the verdict loop's framer on a byte stream), so
//     keep-alive, pipelining, chunked bodies and Expect: 100-continue are
//     handled exactly as on the clear-text path and the event fields are
//     the same. Each released request's bytes are forwarded exactly as
//     received; one request is upstream at a time, so the 403 of a
//     refused pipelined request comes in its place. Responses stream
//     back as they arrive and are framed (for ordering and provenance) by
//     respwatch's tracker, given each released request as RequestStream
//     framed it (Tracker.Pair) and the server's bytes as they are read
//     (Tracker.FeedServer, no synthetic segments).
//   - HTTP/2: net/http's HTTP/2 server on the client side and one
//     net/http ClientConn upstream (the implementation x/net/http2 now
//     wraps); each stream is one effect; a refused stream gets a 403, the
//     other streams go on.
//   - A request whose host is not the server the connection was
//     verified for (SNI, else the address) is refused as misdirected.
//   - Responses are reported to Config.Observe before the client holds
//     their last bytes (HTTP/1.x; HTTP/2 when the length is declared).
//   - WebSocket: after a released upgrade each client message is one
//     effect (ws:message), decided before any of its frames go up; a
//     refused one closes the WebSocket with the notice (1008).
//   - Bodies up to Config.MaxBodyBytes (16 MiB) are decided whole; a
//     longer one is Request.Oversized: the daemon's defer path.
//   - Config.KeyLog receives the secrets of both legs (NSS key log).
//
// # Requirements
//
// Pure Go (crypto/tls, net/http's HTTP/2), no root. The daemon hands it
// connections redirected from the guest with their original destination
// (Handle) or a listener (Serve); see docs/interception.md.
//
// # Tests
//
// Real clients (Go's net/http over HTTP/1.1 and HTTP/2, curl with and
// without --http2, python3's urllib and http.client, Node's fetch)
// against a Go TLS world server on loopback with its own test CA (the
// proxy's extra upstream CA); the world logs every request it receives,
// so a refused request is shown never to reach it. A fuzz target feeds
// arbitrary client streams, split anywhere, through the HTTP/1 framing
// adapter; a benchmark compares keep-alive requests through the proxy
// with direct TLS.
package intercept
