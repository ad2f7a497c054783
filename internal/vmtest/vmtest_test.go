package vmtest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
		err  bool
	}{
		{in: "6.1", want: Spec{Series: "6.1"}},
		{in: "latest 6.12", want: Spec{Series: "6.12"}},
		{in: " latest  6.1 ", want: Spec{Series: "6.1"}},
		{in: "6.1.0-56", want: Spec{Release: "6.1.0-56-amd64"}},
		{in: "6.1.0-56-amd64", want: Spec{Release: "6.1.0-56-amd64"}},
		{in: "6.12.117+deb12", want: Spec{Release: "6.12.117+deb12-amd64"}},
		{in: "6.12.117+deb12-amd64", want: Spec{Release: "6.12.117+deb12-amd64"}},
		{in: "6.12.117+deb12-cloud-amd64", err: true}, // another flavour
		{in: "latest", err: true},
		{in: "latest 6", err: true},
		{in: "6", err: true},
		{in: "host", err: true},
		{in: "6.1.0", err: true},
		{in: "", err: true},
	} {
		got, err := ParseSpec(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("ParseSpec(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// Lines as apt-cache search --names-only prints them on Debian 12 (the
// pattern is wider than the flavour: cloud, rt and dbg must be dropped).
const aptSearch = `linux-image-6.1.0-9-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-55-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud
linux-image-6.1.0-56-rt-amd64-unsigned - Linux 6.1 for 64-bit PCs, PREEMPT_RT
linux-image-6.1.0-56-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.9+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.115+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-6.12.117+deb12-cloud-amd64-unsigned - Linux 6.12 for x86-64 cloud
linux-headers-6.12.117+deb12-amd64 - Header files
`

func TestParseSearch(t *testing.T) {
	for _, tc := range []struct {
		series string
		want   []string
	}{
		{"6.1", []string{"6.1.0-56-amd64", "6.1.0-55-amd64", "6.1.0-9-amd64"}},
		{"6.12", []string{"6.12.117+deb12-amd64", "6.12.115+deb12-amd64", "6.12.9+deb12-amd64"}},
		{"6.6", nil},
	} {
		got := ParseSearch(aptSearch, tc.series)
		if !slices.Equal(got, tc.want) {
			t.Errorf("ParseSearch(series %s) = %q, want %q", tc.series, got, tc.want)
		}
	}
}

func TestPackageSearchPattern(t *testing.T) {
	// The pattern must not take 6.12 for 6.1 (apt reads it as a POSIX regexp).
	if got, want := packageSearchPattern("6.1"), `^linux-image-6\.1\.[0-9].*-amd64-unsigned$`; got != want {
		t.Errorf("packageSearchPattern(6.1) = %q, want %q", got, want)
	}
}

func TestCompareReleases(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"6.1.0-56-amd64", "6.1.0-9-amd64", 1},
		{"6.1.0-9-amd64", "6.1.0-56-amd64", -1},
		{"6.12.117+deb12-amd64", "6.12.9+deb12-amd64", 1},
		{"6.12.9+deb12-amd64", "6.1.0-56-amd64", 1},
		{"6.1.0-56-amd64", "6.1.0-56-amd64", 0},
	} {
		if got := CompareReleases(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareReleases(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestPackageName(t *testing.T) {
	if got, want := PackageName("6.12.117+deb12-amd64"), "linux-image-6.12.117+deb12-amd64-unsigned"; got != want {
		t.Errorf("PackageName = %q, want %q", got, want)
	}
}

// modules.dep and modules.builtin as depmod and Kbuild write them for
// Debian's 6.1 (virtio a module) and 6.12 (virtio built in, .ko.xz).
const (
	dep61 = `kernel/fs/overlayfs/overlay.ko:
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/netfs/netfs.ko:
kernel/net/9p/9pnet.ko:
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
`
	builtin61 = "kernel/fs/ext4/ext4.ko\n"
	dep612    = `kernel/fs/overlayfs/overlay.ko.xz:
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/fs/netfs/netfs.ko.xz:
kernel/net/9p/9pnet.ko.xz:
`
	builtin612 = "kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_pci.ko\nkernel/drivers/char/virtio_console.ko\n"
)

func TestModuleClosure(t *testing.T) {
	for _, tc := range []struct {
		name, dep, builtin string
		roots              []string
		want               []string
		err                bool
	}{
		{"6.1", dep61, builtin61, stage1Modules, []string{
			"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
			"kernel/drivers/virtio/virtio_pci_modern_dev.ko", "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
			"kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/char/virtio_console.ko",
			"kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko",
			"kernel/fs/netfs/netfs.ko", "kernel/fs/fscache/fscache.ko", "kernel/fs/9p/9p.ko",
			"kernel/fs/overlayfs/overlay.ko",
		}, false},
		{"6.12 built-ins skipped", dep612, builtin612, stage1Modules, []string{
			"kernel/fs/netfs/netfs.ko.xz", "kernel/net/9p/9pnet.ko.xz", "kernel/net/9p/9pnet_virtio.ko.xz",
			"kernel/fs/9p/9p.ko.xz", "kernel/fs/overlayfs/overlay.ko.xz",
		}, false},
		{"dash in a name", dep61, builtin61, []string{"virtio-pci"}, []string{
			"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
			"kernel/drivers/virtio/virtio_pci_modern_dev.ko", "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
			"kernel/drivers/virtio/virtio_pci.ko",
		}, false},
		{"unknown module", dep612, builtin612, []string{"nosuch"}, nil, true},
	} {
		got, err := ModuleClosure(strings.NewReader(tc.dep), strings.NewReader(tc.builtin), tc.roots)
		if tc.err {
			if err == nil {
				t.Errorf("%s: ModuleClosure(%v) = %q, want an error", tc.name, tc.roots, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: ModuleClosure(%v) =\n%q, %v\nwant\n%q", tc.name, tc.roots, got, err, tc.want)
		}
		// Whatever the order, every module comes after its dependencies.
		pos := map[string]int{}
		for i, m := range got {
			pos[m] = i
		}
		for _, line := range strings.Split(tc.dep, "\n") {
			mod, deps, _ := strings.Cut(line, ":")
			for _, d := range strings.Fields(deps) {
				if i, ok := pos[mod]; ok && pos[d] > i {
					t.Errorf("%s: %s loads before its dependency %s", tc.name, mod, d)
				}
			}
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	p := qemuParams{
		Accel: AccelTCG, CPUs: 2, MemoryMiB: 3072, Kernel: "/k/vmlinuz", Initrd: "/t/initrd",
		Append: "console=ttyS0", HostRoot: "/", Modules: "/c/a,b/lib/modules/6.1.0-56-amd64", Socket: "/t/ctl.sock",
	}
	args := qemuArgs(p)
	joined := strings.Join(args, " ")
	after := func(flag string) []string {
		var vals []string
		for i := 0; i+1 < len(args); i++ {
			if args[i] == flag {
				vals = append(vals, args[i+1])
			}
		}
		return vals
	}
	for _, tc := range []struct {
		flag string
		want []string
	}{
		{"-accel", []string{"tcg,thread=multi"}},
		{"-cpu", []string{"max"}},
		{"-smp", []string{"2"}},
		{"-m", []string{"3072M"}},
		{"-kernel", []string{"/k/vmlinuz"}},
		{"-initrd", []string{"/t/initrd"}},
		{"-serial", []string{"stdio"}},
		{"-fsdev", []string{
			"local,id=fs0,path=/,security_model=none,readonly=on,multidevs=remap",
			"local,id=fs1,path=/c/a,,b/lib/modules/6.1.0-56-amd64,security_model=none,readonly=on,multidevs=remap",
		}},
		{"-chardev", []string{"socket,id=ctl,path=/t/ctl.sock"}},
	} {
		if got := after(tc.flag); !slices.Equal(got, tc.want) {
			t.Errorf("qemuArgs: %s = %q, want %q\nargs: %s", tc.flag, got, tc.want, joined)
		}
	}
	// Nothing from the host's defaults: no NIC, no disk, no monitor.
	for _, want := range []string{"-nodefaults", "-no-user-config", "-no-reboot"} {
		if !slices.Contains(args, want) {
			t.Errorf("qemuArgs lacks %s: %s", want, joined)
		}
	}
	for _, bad := range []string{"-net", "-nic", "-netdev", "-drive", "-hda"} {
		if slices.Contains(args, bad) {
			t.Errorf("qemuArgs has %s: %s", bad, joined)
		}
	}
	p.Accel, p.CPUs = AccelKVM, 1
	kvm := qemuArgs(p)
	if i := slices.Index(kvm, "-accel"); kvm[i+1] != "kvm" {
		t.Errorf("KVM run: -accel %s, want kvm", kvm[i+1])
	}
	if i := slices.Index(kvm, "-cpu"); kvm[i+1] != "host" {
		t.Errorf("KVM run: -cpu %s, want host", kvm[i+1])
	}
	p.Accel, p.CPUs = AccelTCG, 1
	if tcg1 := qemuArgs(p); tcg1[slices.Index(tcg1, "-accel")+1] != "tcg" {
		t.Errorf("one-vCPU TCG run: -accel %s, want tcg", tcg1[slices.Index(tcg1, "-accel")+1])
	}
}

func TestKernelCmdline(t *testing.T) {
	for _, tc := range []struct {
		extra, init []string
		want        string
	}{
		{nil, DefaultInitArgs, "console=ttyS0 loglevel=4 panic=-1 rdinit=/init -- vm guest-init"},
		{[]string{"loglevel=7"}, []string{"x"}, "console=ttyS0 loglevel=4 panic=-1 rdinit=/init loglevel=7 -- x"},
		{nil, []string{}, "console=ttyS0 loglevel=4 panic=-1 rdinit=/init"},
	} {
		if got := kernelCmdline(tc.extra, tc.init); got != tc.want {
			t.Errorf("kernelCmdline(%q, %q) = %q, want %q", tc.extra, tc.init, got, tc.want)
		}
	}
}

func TestKVMProbeArgs(t *testing.T) {
	args := strings.Join(kvmProbeArgs("/k/vmlinuz"), " ")
	for _, want := range []string{"-accel kvm", "-cpu host", "-kernel /k/vmlinuz", "earlyprintk=serial", "-serial stdio"} {
		if !strings.Contains(args, want) {
			t.Errorf("kvmProbeArgs lacks %q: %s", want, args)
		}
	}
}

func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Event
		err  bool
	}{
		{in: "start 5.57", want: Event{Kind: "start", Uptime: 5570 * time.Millisecond}},
		{in: "stage 5.21 modules", want: Event{Kind: "stage", Stage: "modules", Uptime: 5210 * time.Millisecond}},
		{in: "exit 6.00 3", want: Event{Kind: "exit", Code: 3, Uptime: 6 * time.Second}},
		{in: "error 1.50 mount 9p: no such device", want: Event{Kind: "error", Msg: "mount 9p: no such device", Uptime: 1500 * time.Millisecond}},
		{in: "exit 6.00 x", err: true},
		{in: "exit 6.00", err: true},
		{in: "stage 1.0", err: true},
		{in: "start", err: true},
		{in: "start -1", err: true},
		{in: "start abc", err: true},
		{in: "reboot 1.0", err: true},
	} {
		got, err := ParseEvent(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("ParseEvent(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseEvent(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		// What the guest writes, the host reads back.
		if back, err := ParseEvent(got.String()); err != nil || back != got {
			t.Errorf("ParseEvent(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
}

// The guest's frames, read by the host: output in order on both streams,
// then the events, a big write split into frames.
func TestControlChannel(t *testing.T) {
	var wire bytes.Buffer
	fw := &frameWriter{w: &wire}
	big := bytes.Repeat([]byte("x"), maxFrame+10)
	steps := []func() error{
		func() error { return fw.frame(frameEvent, []byte("start 1.00")) },
		func() error { _, err := (stream{fw, frameStdout}).Write([]byte("hello ")); return err },
		func() error { _, err := (stream{fw, frameStderr}).Write([]byte("oops\n")); return err },
		func() error { _, err := (stream{fw, frameStdout}).Write(big); return err },
		func() error { _, err := (stream{fw, frameStdout}).Write(nil); return err },
		func() error { return fw.frame(frameEvent, []byte("exit 2.00 7")) },
	}
	for i, s := range steps {
		if err := s(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	var stdout, stderr bytes.Buffer
	events := make(chan Event, 4)
	if err := readControl(&wire, &stdout, &stderr, events, nil); err != nil {
		t.Fatalf("readControl: %v", err)
	}
	close(events)
	var got []string
	for e := range events {
		got = append(got, e.String())
	}
	if want := []string{"start 1.00", "exit 2.00 7"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if want := append([]byte("hello "), big...); !bytes.Equal(stdout.Bytes(), want) {
		t.Errorf("stdout: %d bytes, want %d", stdout.Len(), len(want))
	}
	if stderr.String() != "oops\n" {
		t.Errorf("stderr %q, want %q", stderr.String(), "oops\n")
	}
}

func TestControlChannelErrors(t *testing.T) {
	frame := func(kind byte, n uint32, payload string) []byte {
		b := []byte{kind, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], n)
		return append(b, payload...)
	}
	for _, tc := range []struct {
		name string
		wire []byte
		want string
	}{
		{"unknown kind", frame('z', 1, "x"), "unknown kind"},
		{"too big", frame(frameStdout, maxFrame+1, ""), "out of step"},
		{"cut short", frame(frameStdout, 10, "abc"), "cut short"},
		{"bad event", frame(frameEvent, 3, "bye"), "want KIND UPTIME"},
	} {
		err := readControl(bytes.NewReader(tc.wire), io.Discard, io.Discard, make(chan Event, 1), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: readControl error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// cpioEntry is one member of a newc archive, as the kernel reads it.
type cpioEntry struct {
	name       string
	mode       uint32
	rdev       [2]uint32
	data       string
	headerOKAt bool // the header starts 4-byte aligned
}

func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off+110 > len(b) {
			t.Fatalf("cpio: header at %d past the end (%d)", off, len(b))
		}
		h := string(b[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("cpio: bad magic %q at %d", h[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:6+8*i+8], 16, 32)
			if err != nil {
				t.Fatalf("cpio: field %d of %q: %v", i, h, err)
			}
			return uint32(v)
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		name := string(b[off+110 : off+110+namesize-1])
		e := cpioEntry{name: name, mode: mode, rdev: [2]uint32{field(9), field(10)}, headerOKAt: off%4 == 0}
		off = align(off + 110 + namesize)
		e.data = string(b[off : off+size])
		off = align(off + size)
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, e)
	}
}

func TestCPIO(t *testing.T) {
	var buf bytes.Buffer
	c := newCPIO(&buf)
	c.charDev("/dev/console", 5, 1)
	c.file("/a/b/c.txt", 0o644, 5, strings.NewReader("hello"))
	c.file("/a/x", 0o755, 3, strings.NewReader("abc"))
	c.mkdirAll("/a/b/d")
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	var names []string
	for _, e := range got {
		names = append(names, fmt.Sprintf("%s %o %q", e.name, e.mode, e.data))
		if !e.headerOKAt {
			t.Errorf("cpio: %s's header is not 4-byte aligned", e.name)
		}
	}
	want := []string{
		`dev 40755 ""`, `dev/console 20600 ""`, `a 40755 ""`, `a/b 40755 ""`,
		`a/b/c.txt 100644 "hello"`, `a/x 100755 "abc"`, `a/b/d 40755 ""`,
	}
	if !slices.Equal(names, want) {
		t.Errorf("cpio members\n%q\nwant\n%q", names, want)
	}
	if got[1].rdev != [2]uint32{5, 1} {
		t.Errorf("dev/console rdev %v, want 5:1", got[1].rdev)
	}
	// A short reader is an error, not a corrupt archive.
	c = newCPIO(io.Discard)
	c.file("/short", 0o644, 10, strings.NewReader("abc"))
	if err := c.close(); err == nil {
		t.Error("cpio: a file shorter than its size gave no error")
	}
}

func TestELFDeps(t *testing.T) {
	// A Debian binary linked against libc: the interpreter and libc come
	// back as host paths that exist.
	bin := "/usr/bin/true"
	deps, err := ELFDeps(bin)
	if err != nil {
		t.Fatalf("ELFDeps(%s): %v", bin, err)
	}
	var interp, libc bool
	for _, d := range deps {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("ELFDeps(%s): %s: %v", bin, d, err)
		}
		interp = interp || strings.Contains(d, "ld-linux")
		libc = libc || strings.HasSuffix(d, "/libc.so.6")
	}
	if !interp || !libc {
		t.Errorf("ELFDeps(%s) = %q, want the ELF interpreter and libc.so.6", bin, deps)
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 8}
	for _, s := range []string{"abc", "defgh", "ijk"} {
		_, _ = tb.Write([]byte(s))
	}
	if got := tb.String(); got != "defghijk" {
		t.Errorf("tail = %q, want %q", got, "defghijk")
	}
}

// A guest kernel that oopsed or panicked before the command started is
// booted again (multi-threaded TCG once hit an int3 trap in early boot);
// any other console is the run's answer.
func TestBootCrash(t *testing.T) {
	oops := `[    3.118756] RIP: 0010:sched_clock_cpu+0x9/0x190
[    3.123691] ---[ end trace 0000000000000000 ]---
[    3.123689] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI
[    3.123809] RIP: 0010:sched_clock_cpu+0x9/0x190`
	for _, c := range []struct{ console, want string }{
		{oops, "Oops: int3: 0000 [#2] PREEMPT SMP NOPTI"},
		{"[    2.1] Kernel panic - not syncing: VFS: Unable to mount root fs", "Kernel panic - not syncing: VFS: Unable to mount root fs"},
		{"[    1.0] virtio_console: loaded\nsluice-init: no virtio port named sluice.ctl after 30s", ""},
		{"", ""},
	} {
		if got := bootCrash(c.console); got != c.want {
			t.Errorf("bootCrash(%q) = %q, want %q", c.console, got, c.want)
		}
	}
}

// TestNICArgs: a virtio-net card a tap, in order, with distinct MACs;
// multi-queue asks the tap and the card for the queues and the vectors.
func TestNICArgs(t *testing.T) {
	got := strings.Join(nicArgs([]string{"tap0", "tap1"}, 2), " ")
	want := "-netdev tap,id=nic0,ifname=tap0,script=no,downscript=no,vhost=off,queues=2 " +
		"-device virtio-net-pci,netdev=nic0,mac=52:54:00:5e:00:01,mq=on,vectors=6 " +
		"-netdev tap,id=nic1,ifname=tap1,script=no,downscript=no,vhost=off,queues=2 " +
		"-device virtio-net-pci,netdev=nic1,mac=52:54:00:5e:00:02,mq=on,vectors=6"
	if got != want {
		t.Errorf("nicArgs =\n%s\nwant\n%s", got, want)
	}
	if one := strings.Join(nicArgs([]string{"tap0"}, 1), " "); strings.Contains(one, "mq=on") || strings.Contains(one, "queues=") {
		t.Errorf("one queue: %s, want no multi-queue", one)
	}
	var nn *nicNet
	if name, args := nn.wrap([]string{"-m", "1"}); name != QEMU || len(args) != 2 {
		t.Errorf("no NICs: %s %v, want QEMU run as is", name, args)
	}
	nn = &nicNet{netns: "sluice-vmnet-1-1"}
	if name, args := nn.wrap([]string{"-m", "1"}); name != "nsenter" || strings.Join(args, " ") != "--net=/run/netns/sluice-vmnet-1-1 -- "+QEMU+" -m 1" {
		t.Errorf("NICs: %s %v, want QEMU inside the run's namespace", name, args)
	}
}

// TestStartPinnedSurvivesThreadExits: a process started by startPinned,
// with QEMU's parent-death signal, lives on while other goroutines lock
// their threads and exit (which ends those threads), as a lab's namespace
// switches do beside a guest.
func TestStartPinnedSurvivesThreadExits(t *testing.T) {
	cmd := qemuCommand("sleep", []string{"30"})
	reaped := make(chan error, 1)
	if err := startPinned(cmd, func(err error) { reaped <- err }); err != nil {
		t.Fatal(err)
	}
	defer func() { // startPinned's Wait reaps it
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-reaped
	}()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		}()
	}
	wg.Wait()
	select {
	case err := <-reaped:
		reaped <- err // for the deferred kill's wait
		t.Fatalf("the child died while threads ended: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}
