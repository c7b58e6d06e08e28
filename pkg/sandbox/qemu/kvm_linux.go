package qemu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KVM ioctls (linux/kvm.h).
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmRun                 = 0xAE80
	kvmSetRegs             = 0x4090AE82
	kvmGetSregs            = 0x8138AE83
	kvmSetSregs            = 0x4138AE84

	kvmExitIO = 2
)

// DevKVM is the KVM device ProbeAccel opens.
var DevKVM = "/dev/kvm"

// SysModule is where ProbeAccel looks for the loaded KVM modules.
var SysModule = "/sys/module"

// ProbeAccel says which accelerator a stock guest kernel runs under here,
// with the reason, for the operator's status. KVM needs all of:
//
//   - /dev/kvm backed by hardware virtualisation: kvm_intel or kvm_amd
//     loaded and vmx or svm in /proc/cpuinfo. A PVM host (kvm_pvm: KVM
//     in software, as on the machines carbd is developed on) runs only
//     PVM-aware guests; a stock kernel hangs there after decompression.
//   - a real-mode guest that runs to a port write (the first thing any
//     PC guest does).
//
// Otherwise it answers TCG.
func ProbeAccel() (Accel, string) {
	intel := dirExists(SysModule + "/kvm_intel")
	amd := dirExists(SysModule + "/kvm_amd")
	if !intel && !amd {
		if dirExists(SysModule + "/kvm_pvm") {
			return TCG, "kvm is PVM (kvm_pvm, no kvm_intel/kvm_amd): it runs only PVM-aware guests: using tcg"
		}
		return TCG, "no kvm_intel or kvm_amd module: using tcg"
	}
	if !kvmFlags() {
		return TCG, "no vmx/svm in /proc/cpuinfo: using tcg"
	}
	done := make(chan error, 1)
	go func() {
		// The vCPU belongs to the thread that runs it.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- probeKVM()
	}()
	select {
	case err := <-done:
		if err != nil {
			return TCG, "kvm unusable (" + err.Error() + "): using tcg"
		}
		return KVM, "kvm: hardware virtualisation, a probe guest ran on " + DevKVM
	case <-time.After(5 * time.Second):
		// The probe guest halts after two instructions; a run that does
		// not return means KVM does not run it as it should.
		return TCG, "kvm unusable (run probe did not return in 5s): using tcg"
	}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

func ioctl(fd int, req uintptr, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// probeKVM runs "mov al,0x42; out 0x10,al; hlt" in real mode at 0x1000
// and checks that the first exit is the port write.
func probeKVM() error {
	kvm, err := unix.Open(DevKVM, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", DevKVM, err)
	}
	defer unix.Close(kvm)
	if v, err := ioctl(kvm, kvmGetAPIVersion, 0); err != nil || v != 12 {
		return fmt.Errorf("api version %d: %v", v, err)
	}
	vmfd, err := ioctl(kvm, kvmCreateVM, 0)
	if err != nil {
		return fmt.Errorf("create vm: %w", err)
	}
	vm := int(vmfd)
	defer unix.Close(vm)

	const guestAddr, memSize = 0x1000, 0x1000
	mem, err := unix.Mmap(-1, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap guest memory: %w", err)
	}
	defer unix.Munmap(mem)
	copy(mem, []byte{0xb0, 0x42, 0xe6, 0x10, 0xf4})
	region := struct {
		slot, flags                           uint32
		guestPhysAddr, memorySize, userspaceA uint64
	}{0, 0, guestAddr, memSize, uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if _, err := ioctl(vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region))); err != nil {
		return fmt.Errorf("set memory region: %w", err)
	}
	cpufd, err := ioctl(vm, kvmCreateVCPU, 0)
	if err != nil {
		return fmt.Errorf("create vcpu: %w", err)
	}
	cpu := int(cpufd)
	defer unix.Close(cpu)
	size, err := ioctl(kvm, kvmGetVCPUMmapSize, 0)
	if err != nil || size < 64 {
		return fmt.Errorf("vcpu mmap size %d: %v", size, err)
	}
	run, err := unix.Mmap(cpu, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap kvm_run: %w", err)
	}
	defer unix.Munmap(run)

	// struct kvm_sregs: cs is the first kvm_segment {u64 base; u32
	// limit; u16 selector; ...}: base 0, selector 0.
	var sregs [312]byte
	if _, err := ioctl(cpu, kvmGetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("get sregs: %w", err)
	}
	binary.LittleEndian.PutUint64(sregs[0:8], 0)
	binary.LittleEndian.PutUint16(sregs[12:14], 0)
	if _, err := ioctl(cpu, kvmSetSregs, uintptr(unsafe.Pointer(&sregs[0]))); err != nil {
		return fmt.Errorf("set sregs: %w", err)
	}
	// struct kvm_regs: 16 general registers, rip, rflags.
	var regs [18]uint64
	regs[16] = guestAddr
	regs[17] = 0x2
	if _, err := ioctl(cpu, kvmSetRegs, uintptr(unsafe.Pointer(&regs[0]))); err != nil {
		return fmt.Errorf("set regs: %w", err)
	}
	if _, err := ioctl(cpu, kvmRun, 0); err != nil {
		return fmt.Errorf("run probe: %w", err)
	}
	// struct kvm_run: exit_reason at 8; io {u8 direction, size; u16
	// port; u32 count; u64 data_offset} at 32.
	reason := binary.LittleEndian.Uint32(run[8:12])
	if reason != kvmExitIO {
		return fmt.Errorf("run probe: exit reason %d, want %d (io)", reason, kvmExitIO)
	}
	port := binary.LittleEndian.Uint16(run[34:36])
	off := binary.LittleEndian.Uint64(run[40:48])
	if port != 0x10 || off >= uint64(len(run)) || run[off] != 0x42 {
		return fmt.Errorf("run probe: io exit on port %#x with %#x, want 0x42 on 0x10", port, run[min(off, uint64(len(run)-1))])
	}
	return nil
}

// kvmFlags reports whether /proc/cpuinfo shows hardware virtualisation
// (for the reason text; the run probe decides).
func kvmFlags() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(" vmx")) || bytes.Contains(b, []byte(" svm"))
}
