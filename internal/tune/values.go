package tune

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetns runs fn on a thread in the named network namespace ("": the
// caller's). The thread is thrown away afterwards.
func inNetns(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("network namespace %s: %w", name, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter network namespace %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// readSysctl reads a sysctl in a namespace; ok false when it does not
// exist there (a machine-wide one seen from another namespace, or a
// kernel without it).
func readSysctl(ns, name string) (v string, ok bool, err error) {
	err = inNetns(ns, func() error {
		raw, err := os.ReadFile(sysctlPath(name))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		v, ok = normalizeSysctl(string(raw)), true
		return nil
	})
	return v, ok, err
}

// normalizeSysctl makes "4096\t87380\t6291456\n" "4096 87380 6291456".
func normalizeSysctl(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func linkHandle(ns string) (*netlink.Handle, error) {
	if ns == "" {
		return netlink.NewHandle()
	}
	h, err := netns.GetFromName(ns)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", ns, err)
	}
	defer h.Close()
	return netlink.NewHandleAt(h)
}

// linkAttr reads one of the BIG TCP sizes of a device.
func linkAttr(l netlink.Link, attr string) (uint32, error) {
	a := l.Attrs()
	switch attr {
	case "gso_max_size":
		return a.GSOMaxSize, nil
	case "gro_max_size":
		return a.GROMaxSize, nil
	case "gso_ipv4_max_size":
		return a.GSOIPv4MaxSize, nil
	case "gro_ipv4_max_size":
		return a.GROIPv4MaxSize, nil
	}
	return 0, fmt.Errorf("unknown device attribute %q", attr)
}

// set makes c's target hold value (its New to apply, its Old to revert).
func set(c Change, value string) error {
	switch c.Kind {
	case KindSysctl:
		cur, ok, err := readSysctl(c.Netns, c.Target)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no sysctl %s here", c.Target)
		}
		if cur == value {
			return nil
		}
		return inNetns(c.Netns, func() error { return os.WriteFile(sysctlPath(c.Target), []byte(value), 0) })
	case KindLink:
		dev, attr, ok := strings.Cut(c.Target, " ")
		if !ok {
			return fmt.Errorf("device target %q: want DEV ATTR", c.Target)
		}
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not a size", c.Target, value)
		}
		h, err := linkHandle(c.Netns)
		if err != nil {
			return err
		}
		defer h.Close()
		l, err := h.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("device %s: %w", dev, err)
		}
		if cur, err := linkAttr(l, attr); err == nil && int(cur) == n {
			return nil
		}
		switch attr {
		case "gso_max_size":
			return h.LinkSetGSOMaxSize(l, n)
		case "gro_max_size":
			return h.LinkSetGROMaxSize(l, n)
		case "gso_ipv4_max_size":
			return h.LinkSetGSOIPv4MaxSize(l, n)
		case "gro_ipv4_max_size":
			return h.LinkSetGROIPv4MaxSize(l, n)
		}
		return fmt.Errorf("unknown device attribute %q", attr)
	case KindNFT:
		family, table, _ := strings.Cut(c.Target, " ")
		// Deleting what is there first makes both directions one step.
		del := exec.Command("nft", "delete", "table", family, table)
		if c.Netns != "" {
			del = exec.Command("ip", "netns", "exec", c.Netns, "nft", "delete", "table", family, table)
		}
		_ = del.Run() // absent is fine
		if value == "" {
			return nil
		}
		add := exec.Command("nft", "-f", "-")
		if c.Netns != "" {
			add = exec.Command("ip", "netns", "exec", c.Netns, "nft", "-f", "-")
		}
		add.Stdin = strings.NewReader(value)
		if out, err := add.CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f: %v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	case KindFile:
		raw, err := os.ReadFile(c.Target)
		if err == nil && normalizeFile(c.Target, string(raw)) == value {
			return nil
		}
		return os.WriteFile(c.Target, []byte(value), 0)
	case KindService:
		verb := "stop"
		if value == "active" {
			verb = "start"
		}
		if out, err := exec.Command("systemctl", verb, c.Target).CombinedOutput(); err != nil {
			return fmt.Errorf("systemctl %s %s: %v: %s", verb, c.Target, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return fmt.Errorf("unknown change kind %q", c.Kind)
}

// normalizeFile is a file's value as a Change holds it: the selected one
// of a "(none) voluntary full" list, else the trimmed text.
func normalizeFile(path, raw string) string {
	raw = strings.TrimSpace(raw)
	if i := strings.Index(raw, "("); i >= 0 && strings.Contains(raw, ")") {
		if j := strings.Index(raw[i:], ")"); j > 0 {
			return raw[i+1 : i+j]
		}
	}
	return raw
}

// kernel is uname -r and its major and minor.
func kernel() (release string, major, minor int, err error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "", 0, 0, err
	}
	release = unix.ByteSliceToString(uts.Release[:])
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return release, 0, 0, fmt.Errorf("kernel release %q: want major.minor", release)
	}
	return release, major, minor, nil
}
