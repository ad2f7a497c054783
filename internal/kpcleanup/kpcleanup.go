// Package kpcleanup removes what kube-proxy leaves on a node, as
// `kube-proxy --cleanup` does, for the last step of a migration to sluice
// (docs/install.md): its iptables chains and the jumps to them (legacy and
// nft backends, IPv4 and IPv6), its nftables tables, and its IPVS dummy
// device. Conntrack is left alone: the flows kube-proxy balanced keep their
// translation there until they end, and sluice's tc and XDP programs leave
// them to it (bpf/lib/nfct.h).
//
// But netfilter tracks and translates packets in a network namespace only
// while some rule asks for conntrack (a conntrack match, a NAT target or
// chain): the hooks come and go with the ruleset. Where kube-proxy's rules
// were the last such, removing them stops every flow they balanced (found
// by the migration test: all 60 pooled connections lost, through the
// kernel alone too). So before removing anything the cleanup installs a
// keeper, the nftables table inet sluice_migration: a conntrack rule and
// empty NAT chains at the four hooks, which keep conntrack and its NAT
// bindings applied. Finish removes it once kube-proxy's flows are gone.
package kpcleanup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
)

// kubeletChains are KUBE-* chains the kubelet owns, which kube-proxy's
// cleanup leaves too.
var kubeletChains = []string{"KUBE-KUBELET-CANARY", "KUBE-FIREWALL", "KUBE-MARK-DROP", "KUBE-IPTABLES-HINT"}

// proxyChain matches the chains kube-proxy's iptables and ipvs modes make:
// its fixed ones and the per-Service ones.
var proxyChain = regexp.MustCompile(`^KUBE-(SERVICES|EXTERNAL-SERVICES|NODEPORTS|POSTROUTING|MARK-MASQ|FORWARD|PROXY-FIREWALL|PROXY-CANARY|LOAD-BALANCER|NODE-PORT|SOURCE-RANGES-FIREWALL|(SVC|SEP|SVL|EXT|FW|XLB)-[A-Z0-9]+)$`)

// IsProxyChain tells whether chain is one of kube-proxy's.
func IsProxyChain(chain string) bool {
	return proxyChain.MatchString(chain) && !slices.Contains(kubeletChains, chain)
}

// Table is one table of an iptables-save dump, with the restore input that
// removes kube-proxy's part of it.
type Table struct {
	Name   string
	Chains []string // kube-proxy's chains, flushed and deleted
	Jumps  []string // rules of other chains that jump to them, deleted
}

// Empty tells whether the table holds nothing of kube-proxy's.
func (t Table) Empty() bool { return len(t.Chains) == 0 && len(t.Jumps) == 0 }

// Restore is the iptables-restore --noflush input that removes it: the
// jumps first, then each chain flushed (declared) and deleted.
func (t Table) Restore() string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", t.Name)
	for _, c := range t.Chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, j := range t.Jumps {
		fmt.Fprintf(&b, "-D %s\n", j)
	}
	for _, c := range t.Chains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// ParseSave reads an iptables-save dump and returns, per table that holds
// any, kube-proxy's chains and the rules of other chains that jump to them.
func ParseSave(dump []byte) ([]Table, error) {
	var out []Table
	var cur *Table
	sc := bufio.NewScanner(bytes.NewReader(dump))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			out = append(out, Table{Name: line[1:]})
			cur = &out[len(out)-1]
		case cur == nil:
			return nil, fmt.Errorf("iptables-save: %q before a table", line)
		case line == "COMMIT":
			cur = nil
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if IsProxyChain(name) {
				cur.Chains = append(cur.Chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			fields := strings.Fields(line)
			if len(fields) < 2 || IsProxyChain(fields[1]) {
				continue // a rule of a chain that goes whole
			}
			if i := slices.Index(fields, "-j"); i >= 0 && i+1 < len(fields) && IsProxyChain(fields[i+1]) {
				cur.Jumps = append(cur.Jumps, strings.TrimPrefix(line, "-A "))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("iptables-save: %w", err)
	}
	return slices.DeleteFunc(out, Table.Empty), nil
}

// Backend is one iptables binary family: iptables-legacy or iptables-nft,
// for IPv4 or IPv6.
type Backend struct {
	Save, Restore string // binaries, e.g. iptables-legacy-save
	// Tables says whether the namespace has tables of this backend, for
	// when its binaries are missing: then kube-proxy's rules there would
	// go unseen, which must not pass for "nothing found".
	Tables func(ctx context.Context) bool
}

// Backends are every iptables backend a node may have rules in.
var Backends = []Backend{
	{"iptables-legacy-save", "iptables-legacy-restore", legacyTables("ip_tables_names")},
	{"ip6tables-legacy-save", "ip6tables-legacy-restore", legacyTables("ip6_tables_names")},
	{"iptables-nft-save", "iptables-nft-restore", nftXtablesTables("ip")},
	{"ip6tables-nft-save", "ip6tables-nft-restore", nftXtablesTables("ip6")},
}

// legacyTables: the legacy x_tables of the namespace, listed in
// /proc/net/<file> (present once the kernel has the family's tables).
func legacyTables(file string) func(context.Context) bool {
	return func(context.Context) bool {
		b, err := os.ReadFile("/proc/net/" + file)
		return err == nil && len(bytes.TrimSpace(b)) > 0
	}
}

// nftXtablesTables: nftables tables of family that iptables-nft makes
// (filter, nat, mangle, raw, security); without nft, unknown: true.
func nftXtablesTables(family string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
		if err != nil {
			return true
		}
		for _, t := range []string{"filter", "nat", "mangle", "raw", "security"} {
			if slices.Contains(strings.Split(string(out), "\n"), "table "+family+" "+t) {
				return true
			}
		}
		return false
	}
}

// Step is what the cleanup did, or would do, in one place.
type Step struct {
	Where string // "iptables-nft-save nat", "nftables ip kube-proxy", "kube-ipvs0"
	What  string
	Err   error
	do    func() error // the removal, run after the keeper is in place
}

func (s Step) String() string {
	if s.Err != nil {
		return fmt.Sprintf("%s: %s: FAILED: %v", s.Where, s.What, s.Err)
	}
	return fmt.Sprintf("%s: %s", s.Where, s.What)
}

// KeeperTable is the nftables table (family inet) that keeps conntrack and
// NAT on for kube-proxy's flows once its rules are gone.
const KeeperTable = "sluice_migration"

// keeperRuleset is KeeperTable: a conntrack expression (the conntrack
// hooks, IPv4 and IPv6) and a NAT chain at each hook NAT runs at (the NAT
// hooks: a flow's binding is applied only where a NAT chain is).
const keeperRuleset = `table inet ` + KeeperTable + ` {
	comment "sluice: conntrack and NAT on for kube-proxy's flows; sluice cleanup-kube-proxy --finish removes it"
	chain conntrack {
		type filter hook prerouting priority raw; policy accept;
		ct state established counter
	}
	chain nat_prerouting {
		type nat hook prerouting priority dstnat; policy accept;
	}
	chain nat_input {
		type nat hook input priority 100; policy accept;
	}
	chain nat_output {
		type nat hook output priority -100; policy accept;
	}
	chain nat_postrouting {
		type nat hook postrouting priority srcnat; policy accept;
	}
}
`

// Run removes kube-proxy's rules from the calling thread's network
// namespace (dry: only says what it would do), the keeper installed first
// when there is anything to remove. A backend or tool this machine lacks
// is skipped; each failure is one step's, and the rest goes on, but
// nothing is removed without the keeper. Nothing of kube-proxy's found
// gives no steps.
func Run(ctx context.Context, dry bool) []Step {
	var steps []Step
	for _, b := range Backends {
		steps = append(steps, iptablesSteps(ctx, b)...)
	}
	steps = append(steps, nftSteps(ctx)...)
	if s, ok := ipvsStep(); ok {
		steps = append(steps, s)
	}
	if !slices.ContainsFunc(steps, func(s Step) bool { return s.do != nil }) {
		return steps // nothing, or only the errors of reading
	}
	keep := Step{Where: "nftables inet " + KeeperTable,
		What: "keeper installed: conntrack and NAT stay on for kube-proxy's flows (--finish removes it)"}
	if !dry {
		if keep.Err = installKeeper(ctx); keep.Err != nil {
			keep.Err = fmt.Errorf("%w; nothing removed: without it, removing kube-proxy's rules can stop netfilter from translating the flows it balanced", keep.Err)
			return append([]Step{keep}, steps...)
		}
		for i := range steps {
			if steps[i].do != nil {
				steps[i].Err = steps[i].do()
			}
		}
	}
	return append([]Step{keep}, steps...)
}

func installKeeper(ctx context.Context) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("nft: %w (install nftables)", err)
	}
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(keeperRuleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Finish removes the keeper (dry: says whether it is there), once the
// flows kube-proxy balanced have ended: sluice status shows no more
// packets left to netfilter. No keeper gives no steps.
func Finish(ctx context.Context, dry bool) []Step {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	if exec.CommandContext(ctx, "nft", "list", "table", "inet", KeeperTable).Run() != nil {
		return nil
	}
	st := Step{Where: "nftables inet " + KeeperTable, What: "keeper removed"}
	if !dry {
		if out, err := exec.CommandContext(ctx, "nft", "delete", "table", "inet", KeeperTable).CombinedOutput(); err != nil {
			st.Err = fmt.Errorf("nft delete table: %w: %s", err, bytes.TrimSpace(out))
		}
	}
	return []Step{st}
}

func iptablesSteps(ctx context.Context, b Backend) []Step {
	if _, err := exec.LookPath(b.Save); err != nil {
		if b.Tables != nil && b.Tables(ctx) {
			return []Step{{Where: b.Save, What: "read the rules",
				Err: fmt.Errorf("not in PATH, and this namespace has tables of its backend: kube-proxy's rules there, if any, were not checked (install iptables)")}}
		}
		return nil // no tables of this backend: nothing of kube-proxy's there
	}
	dump, err := exec.CommandContext(ctx, b.Save).Output()
	if err != nil {
		return []Step{{Where: b.Save, What: "read the rules", Err: cmdErr(err)}}
	}
	tables, err := ParseSave(dump)
	if err != nil {
		return []Step{{Where: b.Save, What: "read the rules", Err: err}}
	}
	var steps []Step
	for _, t := range tables {
		steps = append(steps, Step{Where: b.Save + " " + t.Name,
			What: fmt.Sprintf("%d chains and %d jumps to them removed", len(t.Chains), len(t.Jumps)),
			do: func() error {
				cmd := exec.CommandContext(ctx, b.Restore, "--noflush")
				cmd.Stdin = strings.NewReader(t.Restore())
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%s: %w: %s", b.Restore, err, bytes.TrimSpace(out))
				}
				return nil
			}})
	}
	return steps
}

// nftTables are the tables kube-proxy's nftables mode makes.
var nftTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

func nftSteps(ctx context.Context) []Step {
	if _, err := exec.LookPath("nft"); err != nil {
		return []Step{{Where: "nftables", What: "list the tables",
			Err: fmt.Errorf("nft not in PATH: kube-proxy's nftables tables, if any, were not checked (install nftables)")}}
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		return []Step{{Where: "nftables", What: "list the tables", Err: cmdErr(err)}}
	}
	var steps []Step
	for _, line := range strings.Split(string(out), "\n") {
		t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "table "))
		if !slices.Contains(nftTables, t) {
			continue
		}
		args := append([]string{"delete", "table"}, strings.Fields(t)...)
		steps = append(steps, Step{Where: "nftables " + t, What: "table deleted", do: func() error {
			if out, err := exec.CommandContext(ctx, "nft", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
			}
			return nil
		}})
	}
	return steps
}

// ipvsDevice is the dummy device kube-proxy's ipvs mode binds Service
// addresses to.
const ipvsDevice = "kube-ipvs0"

// ipvsStep removes kube-ipvs0. IPVS virtual servers themselves go with
// `ipvsadm --clear` (the runbook), which this does not run: it clears
// every virtual server, kube-proxy's or not.
func ipvsStep() (Step, bool) {
	l, err := netlink.LinkByName(ipvsDevice)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return Step{}, false
		}
		return Step{Where: ipvsDevice, What: "look up", Err: err}, true
	}
	return Step{Where: ipvsDevice, What: "device deleted (its Service addresses with it)",
		do: func() error { return netlink.LinkDel(l) }}, true
}

func cmdErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}
