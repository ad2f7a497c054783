package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Accel is the accelerator a guest runs with and why.
type Accel struct {
	Name   string `json:"name"`   // AccelKVM or AccelTCG
	Reason string `json:"reason"` // why this one
}

// kvmProbeTimeout bounds the KVM check. A working KVM guest prints its
// first kernel line in well under a second; on a VM without nested
// virtualisation /dev/kvm may exist and a guest still hang in the boot
// loader, which only a real boot shows.
const kvmProbeTimeout = 10 * time.Second

// accelCacheFile holds the verdict for this boot of the host (/run is
// emptied at boot, and the boot id is checked too).
const accelCacheFile = "/run/sluice/vmtest-accel.json"

type accelCache struct {
	BootID string `json:"boot_id"`
	KVM    bool   `json:"kvm"`
	Reason string `json:"reason"`
}

// ChooseAccel returns the accelerator for want (AccelAuto, AccelKVM or
// AccelTCG). Auto is KVM when a short KVM boot of k reaches the kernel,
// else TCG; the verdict is cached until the host reboots. A forced KVM is
// not checked: the boot timeout catches a hang.
func ChooseAccel(ctx context.Context, want string, k Kernel) (Accel, error) {
	switch want {
	case AccelKVM:
		return Accel{AccelKVM, "asked for (--accel kvm)"}, nil
	case AccelTCG:
		return Accel{AccelTCG, "asked for (--accel tcg)"}, nil
	case AccelAuto, "":
	default:
		return Accel{}, fmt.Errorf("accelerator %q: want auto, kvm or tcg", want)
	}
	bootID := readBootID()
	if c, ok := readAccelCache(bootID); ok {
		if c.KVM {
			return Accel{AccelKVM, c.Reason + " (cached in " + accelCacheFile + ")"}, nil
		}
		return Accel{AccelTCG, "KVM does not work here: " + c.Reason + " (cached in " + accelCacheFile + ")"}, nil
	}
	ok, reason := probeKVM(ctx, k)
	if ctx.Err() != nil {
		return Accel{}, ctx.Err()
	}
	writeAccelCache(accelCache{BootID: bootID, KVM: ok, Reason: reason})
	if ok {
		return Accel{AccelKVM, reason}, nil
	}
	return Accel{AccelTCG, "KVM does not work here: " + reason}, nil
}

func readBootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

func readAccelCache(bootID string) (accelCache, bool) {
	var c accelCache
	b, err := os.ReadFile(accelCacheFile)
	if err != nil || json.Unmarshal(b, &c) != nil || bootID == "" || c.BootID != bootID {
		return accelCache{}, false
	}
	return c, true
}

func writeAccelCache(c accelCache) {
	b, _ := json.Marshal(c)
	// Best effort: without the cache the next run probes again.
	if os.MkdirAll(filepath.Dir(accelCacheFile), 0o755) == nil {
		_ = os.WriteFile(accelCacheFile, b, 0o644)
	}
}

// kvmProbeArgs boots k's kernel alone under KVM with an early console: the
// first line of start_kernel ("Linux version") proves the CPU, paging and
// long mode work under this KVM.
func kvmProbeArgs(vmlinuz string) []string {
	return []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "pc", "-accel", AccelKVM, "-cpu", cpuModel(AccelKVM), "-smp", "1", "-m", "256M",
		"-kernel", vmlinuz, "-append", "console=ttyS0 earlyprintk=serial,ttyS0 panic=-1",
		"-serial", "stdio", "-monitor", "none",
	}
}

// probeKVM reports whether a KVM guest boots here, and what it saw.
func probeKVM(ctx context.Context, k Kernel) (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("open /dev/kvm: %v", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, kvmProbeTimeout)
	defer cancel()
	cmd := qemuCommand(QEMU, kvmProbeArgs(k.Vmlinuz()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, err.Error()
	}
	if err := cmd.Start(); err != nil {
		return false, fmt.Sprintf("start %s: %v", QEMU, err)
	}
	defer killQEMU(cmd)
	seen := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Linux version") {
				seen <- true
				return
			}
		}
		seen <- false
	}()
	select {
	case ok := <-seen:
		if ok {
			return true, "a KVM guest reached start_kernel"
		}
		_ = cmd.Wait()
		return false, fmt.Sprintf("%s under KVM exited before the kernel started: %s",
			QEMU, lastLine(stderr.String()))
	case <-ctx.Done():
		return false, fmt.Sprintf("a KVM guest printed no kernel line within %s (no nested virtualisation?)", kvmProbeTimeout)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// qemuCommand prepares QEMU in a process group of its own (a Ctrl-C on the
// terminal reaches us, and we stop it in order) that the kernel kills if we
// die first.
func qemuCommand(name string, args []string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startPinned starts cmd from an OS thread that stays until cmd has exited,
// then calls waited with Wait's result. QEMU's parent-death signal follows
// the thread that forked it, not this process: a Go thread ends when a
// goroutine locked to it exits (every lab's network-namespace switch), so
// a guest started beside a lab's work (test/e2e's parallel tests) would be
// killed with whichever thread had happened to start it.
func startPinned(cmd *exec.Cmd, waited func(error)) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited(cmd.Wait())
	}()
	return <-started
}

// killQEMU kills QEMU's process group and reaps it.
func killQEMU(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}
