package tune

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sluice-dataplane/sluice/internal/probe/probetest"
)

// snapshot is every value tune could touch in a set of namespaces: all
// sysctls under net/, every device's BIG TCP sizes, the nftables ruleset.
type snapshot map[string]string

func takeSnapshot(t *testing.T, nss []string) snapshot {
	t.Helper()
	s := snapshot{}
	for _, ns := range nss {
		err := inNetns(ns, func() error {
			return filepath.WalkDir("/proc/sys/net", func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				raw, err := os.ReadFile(p)
				if err == nil {
					s[ns+" "+p] = normalizeSysctl(string(raw))
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		h, err := linkHandle(ns)
		if err != nil {
			t.Fatal(err)
		}
		ls, err := h.LinkList()
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			a := l.Attrs()
			s[ns+" link "+a.Name] = fmt.Sprint(a.GSOMaxSize, a.GROMaxSize, a.GSOIPv4MaxSize, a.GROIPv4MaxSize, a.MTU)
		}
		cmd := exec.Command("nft", "list", "ruleset")
		if ns != "" {
			cmd = exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset")
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("nft list ruleset in %q: %v", ns, err)
		}
		s[ns+" nft"] = string(out)
	}
	return s
}

func (s snapshot) diff(o snapshot) []string {
	var d []string
	for _, k := range slices.Sorted(maps.Keys(s)) {
		if v, ok := o[k]; !ok || v != s[k] {
			d = append(d, fmt.Sprintf("%s: %q -> %q", k, s[k], v))
		}
	}
	for k := range o {
		if _, ok := s[k]; !ok {
			d = append(d, fmt.Sprintf("%s: new %q", k, o[k]))
		}
	}
	return d
}

// TestPrivilegedApplyRevert: in two namespaces of their own, joined by a
// veth pair, apply changes what the list asks (the latency profile's
// per-namespace sysctl, BIG TCP sizes, the conntrack bypass), leaves the
// machine's own namespace alone (no --host), and revert puts every value
// of every sysctl, device and ruleset back exactly.
func TestPrivilegedApplyRevert(t *testing.T) {
	probetest.RequireRoot(t, "network namespaces")
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run scripts/deps.sh", tool)
		}
	}
	a, b := fmt.Sprintf("sluice-tune-a-%d", os.Getpid()), fmt.Sprintf("sluice-tune-b-%d", os.Getpid())
	for _, ns := range []string{a, b} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	if out, err := exec.Command("ip", "-n", a, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", b).CombinedOutput(); err != nil {
		t.Fatalf("veth: %v: %s", err, out)
	}
	scope := Scope{Netns: []string{a, b}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:198:18:1::/64")}}
	// Nothing to bypass where conntrack tracks nothing: a fresh namespace.
	idle, err := Check(context.Background(), Scope{Netns: []string{a}, PodCIDRs: scope.PodCIDRs})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range idle {
		if it.ID == "conntrack-bypass" && (it.Possible || len(it.Changes) > 0 || !strings.Contains(it.State, "tracks nothing")) {
			t.Errorf("conntrack-bypass where conntrack tracks nothing: possible %v, changes %v, state %q; want nothing to do", it.Possible, it.Changes, it.State)
		}
	}
	// Conntrack in use in both, as kube-proxy's rules put it.
	for _, ns := range []string{a, b} {
		ruleset := "table inet sluice_test_ct {\n\tchain out {\n\t\ttype filter hook output priority 0; policy accept;\n\t\tct state new accept\n\t}\n}\n"
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(ruleset)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("conntrack rule in %s: %v: %s", ns, err, out)
		}
		for _, c := range [][]string{{"ip", "-n", ns, "link", "set", "lo", "up"}, {"ip", "netns", "exec", ns, "bash", "-c", "echo x > /dev/udp/127.0.0.1/9"}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
			}
		}
	}
	before := takeSnapshot(t, []string{a, b})
	machine := takeSnapshot(t, []string{""})

	items, err := Check(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.State == "" {
			t.Errorf("item %s: no state", it.ID)
		}
		if !it.Applied && !it.CanApply && it.Why == "" && len(it.Flags) == 0 {
			t.Errorf("item %s: neither applied nor applicable, and no reason given", it.ID)
		}
		for _, c := range it.Changes {
			if c.Netns != a && c.Netns != b {
				t.Errorf("item %s: a change outside the scope's namespaces without --host: %s", it.ID, c)
			}
		}
	}
	pending, err := Pending(items, nil)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	done, err := Apply(pending, state)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]bool{}
	for _, c := range done {
		applied[c.Item] = true
	}
	for _, want := range []string{"tuned-profile", "conntrack-bypass", "big-tcp"} {
		if !applied[want] {
			t.Errorf("apply changed nothing for %s (changes %v)", want, done)
		}
	}
	if v, _, _ := readSysctl(a, "net.ipv4.tcp_fastopen"); v != "3" {
		t.Errorf("after apply: tcp_fastopen in %s is %q, want 3", a, v)
	}
	h, err := linkHandle(a)
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("v0")
	h.Close()
	if err != nil || l.Attrs().GSOMaxSize != bigTCPSize {
		t.Errorf("after apply: v0 gso_max_size %v (%v), want %d", gsoOf(l), err, bigTCPSize)
	}
	after, err := Check(context.Background(), scope)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range after {
		// Applied in scope: nothing left to change there (a machine-wide
		// part, without --host, may remain).
		if applied[it.ID] && len(it.Changes) > 0 {
			t.Errorf("check after apply: %s still has changes to make: %v (%s)", it.ID, it.Changes, it.State)
		}
	}
	if d := machine.diff(takeSnapshot(t, []string{""})); len(d) > 0 {
		t.Errorf("apply without --host changed the machine's own namespace:\n%s", strings.Join(d, "\n"))
	}

	if _, err := Revert(state); err != nil {
		t.Fatal(err)
	}
	if d := before.diff(takeSnapshot(t, []string{a, b})); len(d) > 0 {
		t.Errorf("revert left values changed:\n%s", strings.Join(d, "\n"))
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state file after revert: %v, want it removed", err)
	}
}

func gsoOf(l netlink.Link) any {
	if l == nil {
		return nil
	}
	return l.Attrs().GSOMaxSize
}

// With kube-proxy's chains in a namespace the conntrack bypass is not
// offered: its Service NAT un-DNATs a backend's reply through conntrack,
// and notrack between Pods would break every Service.
func TestPrivilegedConntrackBypassKubeProxy(t *testing.T) {
	probetest.RequireRoot(t, "network namespaces")
	ns := fmt.Sprintf("sluice-tune-kp-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for _, c := range [][]string{
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", ns, "iptables", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"ip", "netns", "exec", ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
		{"ip", "netns", "exec", ns, "bash", "-c", "echo x > /dev/udp/127.0.0.1/9"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	items, err := Check(context.Background(), Scope{Netns: []string{ns}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.ID == "conntrack-bypass" && (it.Possible || len(it.Changes) > 0 || !strings.Contains(it.Why, "kube-proxy")) {
			t.Errorf("conntrack-bypass next to kube-proxy: possible %v, changes %v, why %q; want it refused, naming kube-proxy", it.Possible, it.Changes, it.Why)
		}
	}
}
