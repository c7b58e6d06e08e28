// Package chv launches carbd's guest VM with Cloud Hypervisor, the
// production VMM, and talks to it: its command line, its REST API and its
// hybrid vsock, each as Cloud Hypervisor's documentation specifies them
// (docs/api.md, docs/fs.md, docs/vsock.md and the OpenAPI document
// vmm/src/api/openapi/cloud-hypervisor.yaml of its repository; see
// docs/vm.md).
//
// # What it does
//
//   - Config.Args: the cloud-hypervisor argv (pure, golden-tested):
//     --api-socket path=, --kernel (a PVH vmlinux, not a bzImage),
//     --initramfs, --cmdline with the image's carbd.* parameters and
//     carbd.vsock=PORT for the control channel, --cpus boot=,
//     --memory size=,shared=on (needed by --fs), --net tap=,mac=,
//     --fs tag=,socket=, --vsock cid=,socket=, --serial file=,
//     --console off.
//   - Client: the REST API over the Unix socket (HTTP/1.1): GET
//     vmm.ping and vm.info (200 with JSON), PUT vm.pause, vm.resume,
//     vm.shutdown, vm.power-button and vmm.shutdown (204, no body); 404
//     maps to ErrNotCreated, 405 to ErrWrongState.
//   - DialVsock: a host-initiated connection to a guest vsock port
//     through the hybrid vsock socket ("CONNECT <port>\n", answered by
//     "OK <hostport>\n"); the guest helper listens on that port
//     (carbd-guest -vsock-port).
//   - Start/Stop: run the process, wait until vmm.ping answers; stop
//     with vmm.shutdown, then SIGTERM, then SIGKILL.
//
// # Requirements
//
// The cloud-hypervisor binary and /dev/kvm with hardware virtualisation
// (not available on carbd's development machines), root for the tap.
//
// # Tests
//
// Cloud Hypervisor cannot be installed here, so the tests run against a
// fake that implements the documented contract strictly (package
// chvtest, shared with the daemon's cloud-hypervisor backend tests): an
// HTTP server
// on a Unix socket that accepts only the documented endpoints with their
// methods and empty bodies and answers with the documented codes and
// schemas (every request is recorded and compared), a hybrid vsock
// endpoint that reads the CONNECT line exactly, and, for Start, the test
// binary re-executed as a fake cloud-hypervisor that parses the command
// line with the documented option syntax and runs the control protocol
// over the vsock.
package chv
