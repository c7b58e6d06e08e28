// Command carbd-guest is the guest side of carbd's control channel: the
// small static program the guest image's /init starts (and the namespace
// backend runs directly).
//
// # What it does
//
// It opens the control stream, says hello, waits for the task, runs the
// agent command with the task, streams the agent's output back, relays
// notices to the agent, sends the result, and waits for the host's
// shutdown (or the end of the stream) before it exits, or powers the
// guest off with -poweroff.
//
// The control stream is one of:
//
//   - -port NAME: a virtio-serial port (QEMU). The helper finds the port
//     by its name in /sys/class/virtio-ports/*/name (no udev in the
//     image, so /dev/virtio-ports/NAME may not exist) and waits until the
//     host side is connected before it says hello, since QEMU drops what
//     a port carries while no host client is connected.
//   - -vsock-port N: listens on AF_VSOCK port N and serves the first
//     connection (Cloud Hypervisor: the host connects through its hybrid
//     vsock socket with "CONNECT N").
//   - -socket PATH: connects to a Unix socket (the namespace backend).
//   - -fd N: an inherited, already connected descriptor.
//
// # The agent's side
//
// The agent runs in -workdir (default /work when it exists) in its own
// process group, with the helper's environment plus:
//
//	CARBD_TASK      the task text (also written to its stdin, which is
//	                then closed)
//	CARBD_TASK_ID   the task id
//	CARBD_NOTICES   a file to which each notice from carbd is appended as
//	                "--- carbd notice N ---\n<text>\n"; the agent reads it
//	                when an effect failed or at any time
//	CARBD_RESULT    a file the agent may write its answer to; if it does,
//	                that is the result text, else the last 64 KiB of its
//	                stdout is
//	CARBD_WORKDIR   the working directory
//
// and, last, the variables of the host's env message (carbd run --env,
// --env-file), which comes before the task: set in the agent's
// environment only, never in an argv or a log (the log says how many).
// In the image, /init has exported the trust variables (SSL_CERT_FILE,
// REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS,
// GIT_SSL_CAINFO) when it installed a CA bundle, so the agent inherits
// them through the helper's environment.
//
// Notices do not go to stdin, since an agent that reads its task from
// stdin reads until the end of it. The exit status is reported as the
// shell does: the exit code, 128+N when signal N ended the agent, -1 when
// it could not be started. When the main agent process exits, whatever it
// left running in its process group is killed. A shutdown (or the host
// going away) before the result stops the agent: SIGTERM to its process
// group, SIGKILL after -kill-grace.
//
// # Build and tests
//
// CGO_ENABLED=0, static; vmimage/Makefile builds it with -trimpath and no
// build id so the image is reproducible. The session is tested by running
// real commands (sh) over an in-memory control stream, and over a Unix
// socket through run(); the virtio-serial path is exercised by the QEMU
// test in pkg/sandbox/qemu.
package main
