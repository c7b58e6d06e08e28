// Package vmimage builds the guest image (kernel, initramfs with busybox,
// curl, the control helper and a slot for the interception CA) used by the
// qemu backend and valid for Cloud Hypervisor.
package vmimage
