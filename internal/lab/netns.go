package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

const netnsDir = "/run/netns" // where `ip netns add` pins namespaces

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// ipBatch runs iproute2 commands inside the named namespace (`ip -n` enters
// it for the whole batch), one process per namespace instead of per command.
func ipBatch(ctx context.Context, ns string, cmds []string) error {
	args := []string{"-batch", "-"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip -n %s -batch: %w: %s", ns, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// cpuMask is the rps_cpus mask of CPUs 0..n-1: hex, a comma between each
// 32 CPUs, as the kernel writes it.
func cpuMask(n int) string {
	var words []string
	for ; n > 0; n -= 32 {
		w := uint32(0xffffffff)
		if n < 32 {
			w = 1<<uint(n) - 1
		}
		words = append([]string{fmt.Sprintf("%08x", w)}, words...)
	}
	if len(words) == 0 {
		return "0"
	}
	return strings.Join(words, ",")
}

// setRPS steers each flow that dev in namespace ns receives to one CPU
// (Receive Packet Steering over every CPU), as a NIC's RSS does for every
// real node and so for its pods. Without it a lab's backend takes a TCP
// handshake's last ACK and the first request, sent by the client from two
// CPUs, on two CPUs at once, and the kernel (6.18 here) now and then
// answers the request with a RST: its lookup on one CPU misses the
// connection while the other swaps the request socket for the full one in
// the established hash. That reset ~1 in 100,000 new connections with the
// kernel's path and sluice's alike (docs/benchmarks.md, 2026-11-30). sysfs
// shows the devices of the namespace that mounted it: `ip netns exec`
// mounts the namespace's own.
// SetRPS steers what dev in netns ns receives to its first cpus CPUs
// (RPS); 0 turns RPS off: the receiving CPU does the work.
func SetRPS(ctx context.Context, ns, dev string, cpus int) error { return setRPS(ctx, ns, dev, cpus) }

func setRPS(ctx context.Context, ns, dev string, cpus int) error {
	path := "/sys/class/net/" + dev + "/queues/rx-0/rps_cpus"
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sh", "-c",
		"echo "+cpuMask(cpus)+" > "+path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns %s: RPS on %s (%s): %w: %s", ns, dev, path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func addNetns(ctx context.Context, name string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func deleteNetns(name string) error {
	out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput()
	if err != nil {
		if _, serr := os.Stat(netnsPath(name)); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("ip netns delete %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// listNetns returns the pinned namespaces whose name starts with prefix.
func listNetns(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// netnsPids returns the processes living in the named namespace, as
// `ip netns pids` finds them: by the inode of /proc/PID/ns/net.
func netnsPids(name string) ([]int, error) {
	var want unix.Stat_t
	if err := unix.Stat(netnsPath(name), &want); err != nil {
		return nil, fmt.Errorf("stat netns %s: %w", name, err)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(p.Name(), "%d", &pid); err != nil || pid <= 0 {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue // gone, or a kernel thread
		}
		if st.Dev == want.Dev && st.Ino == want.Ino {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// setSysctls writes net.* sysctls inside a namespace. The writes run on an
// OS thread that is switched into the namespace and never switched back: the
// goroutine exits locked, so Go retires the thread and the root namespace's
// sysctls can never be written by mistake.
func setSysctls(ns string, kv map[string]string) error {
	return inNetns(ns, func() error {
		for k, v := range kv {
			path := "/proc/sys/" + strings.ReplaceAll(k, ".", "/")
			if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
				return fmt.Errorf("netns %s: sysctl %s=%s: %w", ns, k, v, err)
			}
		}
		return nil
	})
}

// SetSysctls writes net.* sysctls in one of the lab's namespaces (a node,
// a pod or the client), such as a benchmark's client port range. Only
// net.* keys: in a namespace other than the root one, /proc/sys/net holds
// only what is the namespace's own, while the rest of /proc/sys is the
// machine's.
func (l *Lab) SetSysctls(target string, kv map[string]string) error {
	ep, ok := l.Endpoint(target)
	if !ok {
		return fmt.Errorf("sysctls: lab %s has no pod, node or client named %q", newNames(l.Prefix).base, target)
	}
	for k, v := range kv {
		if !strings.HasPrefix(k, "net.") {
			return fmt.Errorf("sysctl %s=%s in %s: want a net.* sysctl, one of the namespace's own", k, v, target)
		}
	}
	return setSysctls(ep.Netns, kv)
}

// Sysctls of every lab namespace: addresses usable at once (no DAD), and no
// reverse-path filter, which some hosts set by default for new namespaces.
var baseSysctls = map[string]string{
	"net.ipv6.conf.all.accept_dad":     "0",
	"net.ipv6.conf.default.accept_dad": "0",
	"net.ipv4.conf.all.rp_filter":      "0",
	"net.ipv4.conf.default.rp_filter":  "0",
}

// Nodes route between their pods and the fabric.
var nodeSysctls = map[string]string{
	"net.ipv4.ip_forward":          "1",
	"net.ipv6.conf.all.forwarding": "1",
}
