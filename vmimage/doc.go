// Package vmimage is carbd's guest image: a Debian kernel and a busybox
// initramfs with curl, the control helper (vmimage/guest) and a slot for
// the interception CA, built by `make vmimage` into vmimage/out/ (see
// README.md and docs/vm.md). The image serves the qemu backend and is
// valid for Cloud Hypervisor.
//
// The Go package locates a built image (Find) and adds files to it for
// one boot without rebuilding it (WriteOverlay, WithOverlay): the kernel
// unpacks an uncompressed cpio appended to the compressed initramfs over
// it, which is how a per-install CA certificate reaches
// /etc/ssl/certs/carbd-ca.pem.
//
// # Requirements and tests
//
// Building the image needs Debian's apt-get (it downloads the pinned
// kernel package), dpkg-deb, busybox-static, curl, cpio, gzip, kmod and
// Go; the package itself is pure Go. Its tests check the cpio overlay
// with GNU cpio; pkg/sandbox/qemu boots the image.
package vmimage
