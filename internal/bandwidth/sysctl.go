package bandwidth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Sysctl is one server setting --enable-bbr applies, as Cilium's bandwidth
// manager does (the tuning list's "BBR for pods" and server sysctls).
type Sysctl struct {
	Name string // dotted, as sysctl(8) names it
	// Value is set as is; with AtLeast a larger current value stays.
	Value   string
	AtLeast bool
	// Global: the kernel has one for the whole machine (not per network
	// namespace); it is only written from the machine's own namespace.
	Global bool
}

// BBRSysctls are the settings --enable-bbr applies: BBR and no slow start
// after idle for the sockets of the agent's namespace (the Pods' sockets
// get BBR from the socket hook), and the server baselines.
var BBRSysctls = []Sysctl{
	{Name: "net.ipv4.tcp_congestion_control", Value: "bbr"},
	{Name: "net.ipv4.tcp_slow_start_after_idle", Value: "0"},
	{Name: "net.core.somaxconn", Value: "4096", AtLeast: true},
	{Name: "net.ipv4.tcp_max_syn_backlog", Value: "4096", AtLeast: true},
	{Name: "net.core.netdev_max_backlog", Value: "1000", AtLeast: true, Global: true},
}

// SysctlResult is what ApplySysctls did with one setting.
type SysctlResult struct {
	Sysctl
	Was     string
	Now     string
	Skipped string // why it was left alone
}

func (r SysctlResult) String() string {
	switch {
	case r.Skipped != "":
		return fmt.Sprintf("%s left at %s (%s)", r.Name, r.Was, r.Skipped)
	case r.Was == r.Now:
		return fmt.Sprintf("%s=%s", r.Name, r.Now)
	}
	return fmt.Sprintf("%s=%s (was %s)", r.Name, r.Now, r.Was)
}

// ApplySysctls writes each setting under procSys (/proc/sys) in the
// calling thread's network namespace; a global one only when that is the
// machine's own namespace (initNetns), since a lab node or a test must
// not change the machine.
func ApplySysctls(procSys string, settings []Sysctl, initNetns bool) ([]SysctlResult, error) {
	var out []SysctlResult
	var errs []error
	for _, s := range settings {
		path := filepath.Join(procSys, strings.ReplaceAll(s.Name, ".", "/"))
		raw, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", s.Name, err))
			continue
		}
		r := SysctlResult{Sysctl: s, Was: strings.TrimSpace(string(raw))}
		r.Now = r.Was
		switch {
		case s.Global && !initNetns:
			r.Skipped = "machine-wide; the agent is not in the machine's network namespace"
		case s.AtLeast && atLeast(r.Was, s.Value):
		case r.Was != s.Value:
			if err := os.WriteFile(path, []byte(s.Value), 0); err != nil {
				errs = append(errs, fmt.Errorf("set %s=%s: %w", s.Name, s.Value, err))
				continue
			}
			r.Now = s.Value
		}
		out = append(out, r)
	}
	return out, errors.Join(errs...)
}

func atLeast(cur, want string) bool {
	c, err1 := strconv.ParseInt(cur, 10, 64)
	w, err2 := strconv.ParseInt(want, 10, 64)
	return err1 == nil && err2 == nil && c >= w
}

// InInitNetns reports whether the calling thread is in the machine's own
// network namespace (that of PID 1).
func InInitNetns() (bool, error) {
	var self, init unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &self); err != nil {
		return false, err
	}
	if err := unix.Stat("/proc/1/ns/net", &init); err != nil {
		return false, err
	}
	return self.Ino == init.Ino && self.Dev == init.Dev, nil
}
