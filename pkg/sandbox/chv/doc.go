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
//     --api-socket path=, --kernel (the image's vmlinux, booted through
//     its PVH entry note), --initramfs, --cmdline with the image's carbd.*
//     parameters and carbd.vsock=PORT for the control channel, --cpus
//     boot=, --memory size=,shared=on (needed by --fs), --net tap=,mac=
//     (the tap carbd created, by name), --fs tag=,socket=, --vsock
//     cid=,socket=, --serial file=, --console off, --event-monitor fd=3,
//     --pvpanic.
//   - Client: the REST API over the Unix socket (HTTP/1.1): GET
//     vmm.ping and vm.info (200 with JSON), PUT vm.pause, vm.resume,
//     vm.shutdown, vm.power-button (204, no body) and vmm.shutdown (200
//     in the code, 204 in the OpenAPI document: both accepted). Errors
//     are read as the code answers them: a 500 whose body says "VM is
//     not running" or names an InvalidStateTransition is ErrWrongState,
//     "VM is not created" is ErrNotCreated (a 404 from v53, a 500
//     before); Cloud Hypervisor never answers 405.
//   - DialVsock: a host-initiated connection to a guest vsock port
//     through the hybrid vsock socket ("CONNECT <port>\n", answered by
//     "OK <hostport>\n"); the guest helper listens on that port
//     (carbd-guest -vsock-port).
//   - Start/Stop: run the process, wait until vmm.ping answers; stop
//     with vmm.shutdown, then SIGTERM, then SIGKILL. Stopping a VMM that
//     has exited is not an error.
//   - ReadEvents and VM.Events: the event monitor's records, read from a
//     pipe (fd 3). A guest reset ("vm rebooting"/"vm rebooted": a kernel
//     panic under panic=-1 reboots the VM, and Cloud Hypervisor has no
//     option not to) or a pvpanic report ("guest panic") ends the VM: the
//     VMM is stopped and Wait, DialCtrl and Start return ErrGuestEnded.
//
// # Requirements
//
// The cloud-hypervisor binary and /dev/kvm with hardware virtualisation
// (not available on carbd's development machines), root for the tap.
//
// # Tests
//
// Cloud Hypervisor cannot be installed here, so the tests run against a
// fake modelled on its code, v53 (package chvtest, shared with the
// daemon's cloud-hypervisor backend tests; docs/vm.md lists the sources):
// an HTTP server on a Unix socket that answers with the codes, error
// bodies and states the VMM's code gives (not only its OpenAPI
// document), and records as violations the requests carbd must not send
// (another endpoint, a wrong method, a body), a hybrid vsock
// endpoint that reads the CONNECT line exactly, and, for Start, the test
// binary re-executed as a fake cloud-hypervisor that parses the command
// line with the documented option syntax and runs the control protocol
// over the vsock.
package chv
