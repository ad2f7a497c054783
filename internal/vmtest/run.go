package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config is one command run in a guest.
type Config struct {
	Kernel Kernel
	// Accel is AccelAuto (default), AccelKVM or AccelTCG.
	Accel string
	// Init is the sluice-lab binary that becomes the guest's PID 1; default:
	// this executable. InitArgs select its guest mode; default
	// DefaultInitArgs.
	Init     string
	InitArgs []string
	// Argv runs in Dir (default: the caller's working directory, the same
	// path in the guest) with Env (default: PATH, HOME=/root, TERM=dumb).
	Argv []string
	Dir  string
	Env  []string
	// MemoryMiB and CPUs size the guest; defaults 3072 and 2.
	MemoryMiB int
	CPUs      int
	// KernelArgs are added to the guest kernel's command line.
	KernelArgs []string
	// NICs are virtio-net cards joined to each other on the host's side
	// (nics.go), the guest's eth0, eth1, ...; NICQueues their queue pairs
	// (default 1; more is multi-queue, as a cloud VM's).
	NICs      int
	NICQueues int
	// Timeout bounds the whole run, BootTimeout the time to the command's
	// start; defaults 30 and 3 minutes.
	Timeout     time.Duration
	BootTimeout time.Duration
	// Stdout and Stderr get the command's output as it comes (default:
	// discarded). Progress gets one line per step; Console the guest
	// kernel's console (both may be nil).
	Stdout, Stderr    io.Writer
	Progress, Console io.Writer
}

// DefaultInitArgs select the guest init in the sluice CLI (sluice-lab vm guest-init).
var DefaultInitArgs = []string{"vm", "guest-init"}

// Result says how a run went. A command that fails is not an error of the
// run: its status is in ExitCode.
type Result struct {
	Release  string
	Accel    Accel
	ExitCode int
	// Boot is the host's wall time from starting QEMU to the command's start,
	// GuestBoot the guest's uptime then; Command the wall time from the
	// command's start to its exit; Total the whole run, download included.
	Boot, GuestBoot, Command, Total time.Duration
	// BootRetries counts the boots repeated because the guest kernel
	// crashed before the command started (bootAttempts).
	BootRetries int
}

// ErrTimeout is returned when the boot or the command outlives its bound.
var ErrTimeout = errors.New("guest timed out")

// consoleTail is how much of the guest's console an error quotes.
const consoleTail = 4096

func (c *Config) defaults() error {
	if len(c.Argv) == 0 {
		return errors.New("vmtest: no command to run")
	}
	if c.Kernel.Release == "" {
		return errors.New("vmtest: no kernel")
	}
	if c.Init == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("vmtest: the init binary (this executable): %w", err)
		}
		c.Init = exe
	}
	if c.InitArgs == nil {
		c.InitArgs = DefaultInitArgs
	}
	if c.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		c.Dir = wd
	}
	if c.Env == nil {
		c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/root", "TERM=dumb"}
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 3072
	}
	if c.CPUs == 0 {
		c.CPUs = 2
	}
	if c.NICs < 0 || c.NICs > MaxNICs {
		return fmt.Errorf("vmtest: %d NICs: want 0..%d", c.NICs, MaxNICs)
	}
	if c.NICQueues == 0 {
		c.NICQueues = 1
	}
	if c.NICQueues < 1 || c.NICQueues > MaxNICQueues {
		return fmt.Errorf("vmtest: %d queues a NIC: want 1..%d", c.NICQueues, MaxNICQueues)
	}
	// The guest's command knows it is one: the lab moves devices into its
	// namespaces (lab.Config.Uplinks) only there.
	c.Env = append(c.Env, GuestEnv+"="+c.Kernel.Release)
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Minute
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = 3 * time.Minute
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	return nil
}

// Run boots cfg.Kernel under QEMU, runs the command and returns its status.
// Nothing outlives it: QEMU is killed (and reaped) and the run's temporary
// directory removed on success, failure, timeout and cancellation (Ctrl-C
// cancels ctx in the CLI). The host mounts nothing; the guest sees the
// host's files read-only.
func Run(ctx context.Context, cfg Config) (Result, error) {
	start := time.Now()
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	res := Result{Release: cfg.Kernel.Release, ExitCode: -1}
	say := func(format string, a ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "vmtest: [%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
		}
	}
	if _, err := exec.LookPath(QEMU); err != nil {
		return res, fmt.Errorf("%s not found (Debian: apt-get install qemu-system-x86; scripts/deps.sh installs it): %w", QEMU, err)
	}
	accel, err := ChooseAccel(ctx, cfg.Accel, cfg.Kernel)
	if err != nil {
		return res, err
	}
	res.Accel = accel
	say("accelerator %s: %s", accel.Name, accel.Reason)

	tmp, err := os.MkdirTemp("", "sluice-vm-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	initrd := filepath.Join(tmp, "initrd.cpio")
	gc := guestConfig{
		Release: cfg.Kernel.Release, Argv: cfg.Argv, Dir: cfg.Dir, Env: cfg.Env,
		Hostname: "vm-" + cfg.Kernel.Release, HostTag: hostTag, ModulesTag: modulesTag, Port: portName, NICs: cfg.NICs,
	}
	if err := writeInitramfs(initrd, cfg.Init, cfg.Kernel, gc); err != nil {
		return res, err
	}
	var nics *nicNet
	if cfg.NICs > 0 {
		if nics, err = setupNICs(ctx, cfg.NICs, cfg.NICQueues); err != nil {
			return res, err
		}
		defer nics.close()
		say("%d virtio-net NICs of %d queue pairs, joined by a bridge in netns %s", cfg.NICs, cfg.NICQueues, nics.netns)
	}
	for attempt := 1; ; attempt++ {
		var crash string
		res, crash, err = boot(ctx, cfg, res, filepath.Join(tmp, "ctl.sock"), initrd, nics, start, say)
		if crash == "" || attempt == bootAttempts || ctx.Err() != nil {
			return res, err
		}
		res.BootRetries++
		say("guest kernel crashed before the command started (%s): not the command's doing; booting again (attempt %d of %d)",
			crash, attempt+1, bootAttempts)
	}
}

// bootAttempts bounds the boots of one run: a guest kernel that crashes
// before the command starts (an oops in early boot: multi-threaded TCG
// has hit int3 traps while the kernel patches its own text) is booted
// once more; anything else is the run's answer.
const bootAttempts = 2

// bootCrash returns the line of console that says the guest kernel
// crashed (an oops or a panic), or "".
func bootCrash(console string) string {
	for _, line := range strings.Split(console, "\n") {
		if i := strings.Index(line, "Oops:"); i >= 0 {
			return strings.TrimSpace(line[i:])
		}
		if i := strings.Index(line, "Kernel panic"); i >= 0 {
			return strings.TrimSpace(line[i:])
		}
	}
	return ""
}

// boot runs the guest once. crash is set when it failed because the guest
// kernel crashed before the command started (bootCrash), the one failure
// Run boots again for.
func boot(ctx context.Context, cfg Config, res Result, sock, initrd string, nics *nicNet, start time.Time,
	say func(string, ...any)) (_ Result, crash string, _ error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return res, "", fmt.Errorf("control socket: %w", err)
	}
	defer ln.Close()

	args := qemuArgs(qemuParams{
		Accel: res.Accel.Name, CPUs: cfg.CPUs, MemoryMiB: cfg.MemoryMiB,
		Kernel: cfg.Kernel.Vmlinuz(), Initrd: initrd, Append: kernelCmdline(cfg.KernelArgs, cfg.InitArgs),
		HostRoot: "/", Modules: cfg.Kernel.ModulesDir(), Socket: sock,
	})
	if nics != nil {
		args = append(args, nicArgs(nics.taps, cfg.NICQueues)...)
	}
	cmd := qemuCommand(nics.wrap(args))
	console := &tailBuffer{max: consoleTail}
	var consoleW io.Writer = console
	if cfg.Console != nil {
		consoleW = io.MultiWriter(console, cfg.Console)
	}
	cmd.Stdout = consoleW
	cmd.Stderr = consoleW
	say("booting %s: %s -accel %s -smp %d -m %dM", cfg.Kernel.Release, QEMU, accelArg(res.Accel.Name, cfg.CPUs), cfg.CPUs, cfg.MemoryMiB)
	bootStart := time.Now()
	// One Wait, whose end every path below can see: reaped closes after it
	// and waitErr holds its result.
	var waitErr error
	reaped := make(chan struct{})
	if err := startPinned(cmd, func(err error) { waitErr = err; close(reaped) }); err != nil {
		return res, "", fmt.Errorf("start %s: %w", QEMU, err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its process group
		<-reaped
	}()

	// QEMU connects to the socket at start-up.
	connc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			connc <- c
		}
	}()
	fail := func(err error) (Result, string, error) {
		res.Total = time.Since(start)
		// Only when the command never started, and not a timeout
		// (a hang boots no better the second time).
		if res.Boot == 0 && !errors.Is(err, ErrTimeout) {
			crash = bootCrash(console.String())
		}
		return res, crash, fmt.Errorf("%w\nguest console (last lines):\n%s", err, indent(console.String()))
	}
	var conn net.Conn
	select {
	case conn = <-connc:
	case <-reaped:
		return fail(fmt.Errorf("%s exited before connecting its control port: %v", QEMU, waitErr))
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(30 * time.Second):
		return fail(fmt.Errorf("%s did not connect its control port within 30s", QEMU))
	}
	defer conn.Close()

	events := make(chan Event, 16)
	readErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() { readErr <- readControl(conn, cfg.Stdout, cfg.Stderr, events, done) }()

	total := time.NewTimer(cfg.Timeout - time.Since(start))
	defer total.Stop()
	boot := time.NewTimer(cfg.BootTimeout)
	defer boot.Stop()
	var cmdStart time.Time
	for {
		select {
		case e := <-events:
			switch e.Kind {
			case "stage":
				say("guest: %s ready (guest uptime %.2fs)", e.Stage, e.Uptime.Seconds())
				// The guest's driver has negotiated its features, on
				// which QEMU clears any steering program: RSS now.
				if e.Stage == "nics" && nics != nil && cfg.NICQueues > 1 {
					if err := nics.steerTaps(); err != nil {
						return res, "", err
					}
					say("RSS on the taps: each frame's queue from its outer headers, as a NIC's (steer.go)")
				}
			case "start":
				cmdStart = time.Now()
				res.Boot, res.GuestBoot = cmdStart.Sub(bootStart), e.Uptime
				boot.Stop()
				say("guest up in %.1fs (guest uptime %.2fs): running %s", res.Boot.Seconds(), e.Uptime.Seconds(), strings.Join(cfg.Argv, " "))
			case "exit":
				res.ExitCode = e.Code
				res.Command = time.Since(cmdStart)
				_, _ = conn.Write([]byte{ackByte})
				say("exit status %d after %.1fs (boot %.1fs, total %.1fs)", e.Code, res.Command.Seconds(), res.Boot.Seconds(), time.Since(start).Seconds())
				// The guest powers off on the ack; give it a moment, then kill.
				select {
				case <-reaped:
				case <-time.After(5 * time.Second):
				}
				res.Total = time.Since(start)
				return res, "", nil
			case "error":
				_, _ = conn.Write([]byte{ackByte})
				return fail(fmt.Errorf("guest init: %s", e.Msg))
			}
		case err := <-readErr:
			if err == nil {
				err = errNoExit
			}
			return fail(fmt.Errorf("control channel: %w", err))
		case <-reaped:
			return fail(fmt.Errorf("%s exited before the command finished: %v", QEMU, waitErr))
		case <-boot.C:
			return fail(fmt.Errorf("%w: the command did not start within --boot-timeout %s", ErrTimeout, cfg.BootTimeout))
		case <-total.C:
			return fail(fmt.Errorf("%w: the run did not finish within --timeout %s", ErrTimeout, cfg.Timeout))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
}

// readControl demultiplexes the control channel until it ends: output to
// stdout and stderr, events to events.
func readControl(r io.Reader, stdout, stderr io.Writer, events chan<- Event, done <-chan struct{}) error {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		kind, p, err := readFrame(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch kind {
		case frameStdout:
			_, _ = stdout.Write(p)
		case frameStderr:
			_, _ = stderr.Write(p)
		case frameEvent:
			e, err := ParseEvent(string(p))
			if err != nil {
				return err
			}
			select {
			case events <- e:
			case <-done:
				return nil
			}
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

func indent(s string) string {
	s = strings.TrimRight(strings.ReplaceAll(s, "\r", ""), "\n")
	if s == "" {
		return "  (nothing)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}
