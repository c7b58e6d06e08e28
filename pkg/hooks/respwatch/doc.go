// Package respwatch observes what the world sends back to the sandbox, so
// that carbd's provenance sees it (Kairos §III-C): the responses of the
// guest's HTTP requests become incoming decide.Events (channel net,
// direction in) that the daemon hands to Engine.Observe. A value from a
// trusted source then enters T, the tokens of a sensitive source enter
// S, and an untrusted value gets an origin the oracle and the audit can
// name ("fetch:news.example/today").
//
// # What it does
//
// A Tracker takes the frames the capture sees on the host side of the
// sandbox's veth or tap (Ethernet, both directions):
//
//   - the guest's segments go through netparse's request parser (the one
//     the verdict loop uses), so each response is paired with the
//     request of the same connection, in order (HTTP/1.x answers in
//     request order, pipelined or not), and is named by it;
//   - the server's bytes are reassembled per connection: out-of-order
//     segments are kept (bounded per connection and in total),
//     retransmissions are ignored, and bytes the guest acknowledges that
//     carbd never saw (a dropped or truncated frame) are lost: the
//     response they belong to is reported with what arrived before the
//     hole and flagged opaque; when the hole is inside a Content-Length
//     body, a chunk's data or a close-delimited body the next response is
//     still found, otherwise the rest of the connection is not parsed;
//   - HTTP/1.x responses are parsed incrementally (status line, header
//     fields, Content-Length, chunked, close-delimited, no body for HEAD,
//     1xx, 204, 304; tunnels after 101 and CONNECT) with the framer the
//     request parser uses (netparse/http1: field lines, Content-Length,
//     Transfer-Encoding, chunked bodies, here with lenient line ends),
//     the same whatever the segments (TestResponseSegmentation), and gzip and deflate
//     bodies are decoded up to a bound; other codings are reported raw
//     and opaque. A Content-Length body is kept in one buffer of its
//     final size (at most the bound) that the event takes without a
//     copy; past the bound body bytes are counted, not copied.
//
// A caller that holds a connection's bytes in process
// (pkg/hooks/intercept) opens it with its handshake frames, then gives
// the requests it framed with netparse (Tracker.Pair, RequestOf) and the
// server's bytes without frames (Tracker.FeedServer): the events are
// those of the same frames (TestEventsGolden).
//
// Events (see docs/responses.md for every field):
//
//   - "http:response": Obj the request's URL, Source "fetch:<host><path>",
//     Content the decoded body (at most MaxBodyBytes, 1 MiB), Dest the
//     server (Host from the request's Host header when the resolver gave
//     that name for the address, see Config.Resolved);
//   - "http:response-headers": the values of Location, Content-Location,
//     Refresh and Set-Cookie (Config.HeaderValues), when present;
//   - "tls:response": once per TLS connection, no content, opaque;
//   - "tcp:response": once per connection of another protocol, its first
//     MaxOpaqueBytes (4 KiB), opaque.
//
// UDP (DNS answers are the daemon's resolver's business), ICMP and
// fragments produce nothing.
//
// A Watcher runs a Tracker on its own goroutine behind a bounded queue:
// the capture calls Watcher.Record from pkg/hooks/capture's
// WithFrameFunc and never blocks; a full queue drops the frame and
// counts it. WaitSeen lets the daemon wait, before deciding a request,
// until the responses the guest had received when it sent it are
// observed.
//
// # Requirements
//
// Pure Go, no cgo, no root: the Tracker is a function of the frames and
// of the times passed in (it never reads the clock). Capturing the
// frames (pkg/hooks/capture) needs CAP_NET_RAW in the interface's
// namespace.
//
// # Tests
//
// Table-driven tests of the response parser (framing, codings, bounds,
// malformed input, every split point of a response), tracker tests with
// frames built by gopacket's serializer (keep-alive, pipelining, HEAD,
// 100-continue, reordering, retransmission, loss in a body and in a
// head, truncated frames, TLS, opaque streams, missed handshakes, memory,
// flow and queue bounds, partial responses, IPv6, Host claims the
// resolver does not back). TestCaptureReal (root) makes real traffic
// (curl and Go's client against Go's net/http server, across a veth pair
// between two namespaces it creates), captures it with pkg/hooks/capture
// and checks the events; its capture is kept in testdata/ so that the
// replay tests (the same checks, and the same frames reordered or with
// one lost) run without root. Fuzz targets for the parser and the
// tracker keep their corpus under testdata/fuzz/; benchmarks report MB/s.
package respwatch
