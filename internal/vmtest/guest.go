package vmtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// GuestInit is the guest's PID 1 (the kernel starts the sluice binary from
// the initramfs as /init with the arguments after "--" on its command line,
// "vm guest-init"). It loads the stage-1 modules, mounts the host's
// filesystem read-only over 9p under a tmpfs overlay (the guest writes only
// to its own memory), mounts the kernel's own /lib/modules, runs the
// command, reports its output and exit status on the control port, and
// powers the guest off. It never returns.
func GuestInit() {
	g := &guest{}
	err := g.run()
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-vm init: %v\n", err)
		if g.fw != nil {
			_ = g.fw.frame(frameEvent, []byte(Event{Kind: "error", Msg: err.Error(), Uptime: uptime()}.String()))
			g.waitAck()
		}
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // PID 1 must not exit: the kernel would panic
}

type guest struct {
	cfg     guestConfig
	port    *os.File
	fw      *frameWriter
	pending []Event // stages done before the port opened
}

// moduleInitCompressedFile is finit_module's MODULE_INIT_COMPRESSED_FILE
// (5.17): the kernel decompresses the module itself (6.12's are .ko.xz).
const moduleInitCompressedFile = 4

func (g *guest) stage(name string) {
	e := Event{Kind: "stage", Stage: name, Uptime: uptime()}
	if g.fw == nil {
		g.pending = append(g.pending, e)
		return
	}
	_ = g.fw.frame(frameEvent, []byte(e.String()))
}

func (g *guest) run() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	b, err := os.ReadFile(guestConfigPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &g.cfg); err != nil {
		return fmt.Errorf("%s: %w", guestConfigPath, err)
	}
	for _, m := range g.cfg.Modules {
		if err := loadModule(m); err != nil {
			return err
		}
	}
	g.stage("modules")
	if err := g.openPort(); err != nil {
		return err
	}
	if err := g.mountRoot(); err != nil {
		return err
	}
	g.stage("root")
	if g.cfg.NICs > 0 {
		if err := waitNICs(g.cfg.NICs); err != nil {
			return err
		}
		g.stage("nics")
	}
	return g.command()
}

// waitNICs loads virtio_net with the host's modprobe (the package's modules
// are mounted by now) and waits for n Ethernet devices, eth0 to eth<n-1>.
func waitNICs(n int) error {
	if out, err := exec.Command("/sbin/modprobe", "virtio_net").CombinedOutput(); err != nil {
		return fmt.Errorf("modprobe virtio_net: %w: %s", err, strings.TrimSpace(string(out)))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := ""
		for i := range n {
			if _, err := os.Stat(fmt.Sprintf("/sys/class/net/eth%d", i)); err != nil {
				missing = fmt.Sprintf("eth%d", i)
				break
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after 30s (%d virtio-net NICs asked for)", missing, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	if !strings.HasSuffix(p, ".ko") {
		flags = moduleInitCompressedFile
	}
	if err := unix.FinitModule(int(f.Fd()), "", flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", p, err)
	}
	return nil
}

// openPort finds the control port by name (/sys/class/virtio-ports/*/name)
// and sends the stages done so far.
func (g *guest) openPort() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			b, err := os.ReadFile(n)
			if err != nil || strings.TrimSpace(string(b)) != g.cfg.Port {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			f, err := os.OpenFile(dev, os.O_RDWR, 0)
			if err != nil {
				if time.Now().After(deadline) {
					return fmt.Errorf("open control port %s: %w", dev, err)
				}
				continue
			}
			g.port = f
			g.fw = &frameWriter{w: f}
			for _, e := range g.pending {
				_ = g.fw.frame(frameEvent, []byte(e.String()))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no virtio port named %s after 30s (virtio_console loaded: %v)", g.cfg.Port, names)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mount9p mounts a read-only 9p share, waiting for its device to be probed.
func mount9p(tag, dir string) error {
	opts := "trans=virtio,version=9p2000.L,cache=loose,msize=524288"
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := unix.Mount(tag, dir, "9p", unix.MS_RDONLY, opts)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOENT) || time.Now().After(deadline) {
			return fmt.Errorf("mount 9p share %s on %s: %w", tag, dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountRoot builds the guest's root: the host's / read-only over 9p, an
// overlay whose upper layer is guest memory, moved onto / and chrooted into,
// with the guest's own kernel filesystems and a fresh /run (the host's
// holds its network namespaces and lab state). /tmp stays the host's view,
// so binaries built there run; what the guest writes stays in its memory.
func (g *guest) mountRoot() error {
	if err := mount9p(g.cfg.HostTag, "/host"); err != nil {
		return err
	}
	if err := unix.Mount("rw", "/rw", "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on /rw: %w", err)
	}
	for _, d := range []string{"/rw/upper", "/rw/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", "/newroot", "overlay", 0,
		"lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work"); err != nil {
		return fmt.Errorf("mount overlay (the host's / read-only, writes in guest memory) on /newroot: %w", err)
	}
	// switch_root: the new root replaces the initramfs, which stays in memory.
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into the new root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	mods := filepath.Join("/lib/modules", g.cfg.Release)
	mounts := []struct {
		src, dst, fstype, data string
		optional               bool
	}{
		{"proc", "/proc", "proc", "", false},
		{"sysfs", "/sys", "sysfs", "", false},
		{"devtmpfs", "/dev", "devtmpfs", "", false},
		{"devpts", "/dev/pts", "devpts", "ptmxmode=0666", false},
		{"shm", "/dev/shm", "tmpfs", "mode=1777", false},
		{"run", "/run", "tmpfs", "mode=0755", false},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", "", false},
		{"bpf", "/sys/fs/bpf", "bpf", "", false},
		{"debugfs", "/sys/kernel/debug", "debugfs", "", true},
		{"tracefs", "/sys/kernel/tracing", "tracefs", "", true},
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.dst, 0o755); err != nil && !m.optional {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, m.data); err != nil && !m.optional {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return err
	}
	if err := mount9p(g.cfg.ModulesTag, mods); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(g.cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// command runs the command with its output on the control port and sends
// its exit status.
func (g *guest) command() error {
	if len(g.cfg.Argv) == 0 {
		return errors.New("no command")
	}
	// exec looks the command up in our own PATH (the kernel gives init
	// none): take the command's.
	for _, kv := range g.cfg.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			os.Setenv("PATH", v)
		}
	}
	cmd := exec.Command(g.cfg.Argv[0], g.cfg.Argv[1:]...)
	cmd.Dir = g.cfg.Dir
	cmd.Env = g.cfg.Env
	cmd.Stdout = stream{g.fw, frameStdout}
	cmd.Stderr = stream{g.fw, frameStderr}
	// Daemons the command leaves behind may hold its output open: stop
	// waiting for them shortly after it exits.
	cmd.WaitDelay = 2 * time.Second
	_ = g.fw.frame(frameEvent, []byte(Event{Kind: "start", Uptime: uptime()}.String()))
	code := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			if cmd.ProcessState == nil {
				return fmt.Errorf("start %s: %w", g.cfg.Argv[0], err)
			}
		}
		code = exitCode(cmd.ProcessState)
	}
	_ = g.fw.frame(frameEvent, []byte(Event{Kind: "exit", Code: code, Uptime: uptime()}.String()))
	g.waitAck()
	return nil
}

// exitCode is the shell's convention: the status, or 128+signal.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// waitAck waits (bounded) for the host to confirm it has read everything.
func (g *guest) waitAck() {
	done := make(chan struct{})
	go func() {
		b := make([]byte, 1)
		for {
			n, err := g.port.Read(b)
			if err != nil || n == 1 && b[0] == ackByte {
				break
			}
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

func uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
