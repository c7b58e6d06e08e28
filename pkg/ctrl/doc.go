// Package ctrl is carbd's control-channel protocol: the task goes from the
// host to the guest, output and the result come back, and abort notices
// reach the agent (Kairos §III-D, the ctrl channel).
//
// # Wire format
//
// JSON lines over one byte stream: a virtio-serial port under QEMU,
// Cloud Hypervisor's hybrid vsock, or a Unix socket in the namespace
// backend. Each message is one JSON object on one line, terminated by
// "\n", at most MaxLine bytes long. Its "type" key says which message it
// is and which other keys it has; every one of those keys is required,
// and nothing else is allowed:
//
//	guest -> host  {"type":"hello","version":2}
//	host -> guest  {"type":"env","vars":["API_KEY=..."]}
//	host -> guest  {"type":"task","id":"t1","text":"...","argv":["sh","-c","..."]}
//	guest -> host  {"type":"started","pid":42}
//	guest -> host  {"type":"output","stream":"stdout","data":"aGVsbG8K"}
//	host -> guest  {"type":"notice","text":"..."}
//	guest -> host  {"type":"result","status":0,"text":"..."}
//	host -> guest  {"type":"shutdown"}
//
// An env message's entries are NAME=VALUE, each name once; the guest
// adds them to the agent's environment only (never to an argv, a log or
// the kernel command line). They are credentials: no error of this
// package quotes them.
//
// Output data is base64 (standard encoding, as encoding/json writes a
// []byte), so any byte sequence the agent writes travels unchanged; a
// chunk holds at most MaxChunk bytes. A result's status is the agent's
// exit status (0-255), 128+N when signal N killed it, or -1 when it could
// not be started.
//
// # Session
//
// The guest says hello first; the host checks the version (MinVersion to
// Version), sends the agent's environment in one env message when there
// is one (only to a guest of EnvVersion or later: version 1 has no env
// message), and sends one task. The guest runs
// it, sends started, streams output, relays notices to the agent, sends
// the result, and waits for shutdown (or the end of the stream) before it
// powers off. A shutdown before the result aborts the task: the guest
// stops the agent and still sends the result.
//
// # Strictness
//
// Decoding rejects, with the line number: lines over MaxLine, anything but
// a single JSON object, unknown types, unknown, missing, duplicate or null
// keys, values of the wrong JSON type and values out of range (see each
// message's Validate). Send validates too, so a peer never receives what
// its decoder would reject. Errors on one line do not end the stream: the
// next Recv reads the next line.
//
// # Requirements and tests
//
// Pure Go, standard library only, no privileges. Conn is tested over
// in-memory pipes and with table-driven decode cases; the decoder is
// fuzzed (FuzzDecode, corpus in testdata/fuzz/) with the property that
// whatever it accepts re-encodes to a line it decodes to the same message.
package ctrl
