// Package sandbox holds carbd's sandbox backends: netns (the embedded
// default: user, PID, mount and network namespaces behind a veth pair),
// qemu (a real VM under KVM or TCG) and chv (Cloud Hypervisor, the
// production backend). Each puts the agent behind the host channels carbd
// mediates: a network interface on the host, the staging merged view of
// the working directory, and a control channel.
package sandbox
