package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// An agent unloading for good (the way back to kube-proxy) first drains:
// a flow sluice has no state for, a TCP SYN or a UDP datagram, goes to
// the stack untouched and makes no state, where kube-proxy's rules take
// it, while a flow sluice has is still translated until the programs
// detach (its entry handed to netfilter's conntrack meanwhile); while the
// entries are written a local backend's packets are dropped; once handed
// over they go to the stack untranslated, as netfilter's entry translates
// them.
func TestPrivilegedNorthSouthDrain(t *testing.T) {
	forEachIngress(t, func(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) {
		run := runner(t, prog)
		cfg, err := n.Config()
		must(t, err)
		setFlags := func(f uint32) {
			t.Helper()
			c := cfg
			c.Flags = f
			must(t, n.SetConfig(c))
		}
		t.Cleanup(func() { setFlags(cfg.Flags) })

		// Flows made before the drain: to a remote backend, to a local one.
		live := bpftest.Packet{Src: client(47200), Dst: apLBUDP, Proto: bpftest.UDP, Payload: []byte("q")}
		local := bpftest.Packet{Src: client(47204), Dst: apExtIP, Proto: bpftest.UDP, Payload: []byte("q")}
		for _, p := range []bpftest.Packet{live, local} {
			if res := run(p); kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(p.MustBytes()) {
				t.Fatalf("%s before the drain: verdict %s; want it balanced", bpftest.Describe(p.MustBytes()), kind.verdicts[res.Verdict])
			}
		}

		setFlags(cfg.Flags | lbmap.NSConfigDrain)
		for _, p := range []bpftest.Packet{
			{Src: client(47201), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN},
			{Src: client(47202), Dst: apLBUDP, Proto: bpftest.UDP, Payload: []byte("q")},
		} {
			in := p.MustBytes()
			res := run(p)
			if kind.verdicts[res.Verdict] != vPass || string(res.Frame) != string(in) {
				t.Errorf("%s while draining: verdict %s, frame %s; want it passed to the stack untouched",
					bpftest.Describe(in), kind.verdicts[res.Verdict], bpftest.Describe(res.Frame))
			}
			if hasFlow(t, n, p) {
				t.Errorf("%s while draining: a BPF flow was made", bpftest.Describe(in))
			}
		}
		// The flow sluice has: its next datagram is still balanced.
		if res := run(live); kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(live.MustBytes()) {
			t.Errorf("%s (a flow sluice has) while draining: verdict %s; want it still balanced", bpftest.Describe(live.MustBytes()), kind.verdicts[res.Verdict])
		}

		// Handing over (the entries being written): the local flow's
		// packets are dropped, neither translated (a clash with an entry
		// just written) nor left to kube-proxy's rules before their entry
		// is there; TCP retransmits them. The remote one is still
		// balanced.
		setFlags(cfg.Flags | lbmap.NSConfigDrain | lbmap.NSConfigHandingOver)
		if res := run(local); kind.verdicts[res.Verdict] != vDrop {
			t.Errorf("%s (a local flow) while handing over: verdict %s; want it dropped", bpftest.Describe(local.MustBytes()), kind.verdicts[res.Verdict])
		}
		if res := run(live); kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(live.MustBytes()) {
			t.Errorf("%s (a remote flow) while handing over: verdict %s; want it still balanced", bpftest.Describe(live.MustBytes()), kind.verdicts[res.Verdict])
		}

		// Handed over: the local flow's packets go to the stack untouched
		// (netfilter's entry translates them; translated here they would
		// clash with it), the remote one is still balanced.
		setFlags(cfg.Flags | lbmap.NSConfigDrain | lbmap.NSConfigHandingOver | lbmap.NSConfigHandedOver)
		if res := run(local); kind.verdicts[res.Verdict] != vPass || string(res.Frame) != string(local.MustBytes()) {
			t.Errorf("%s (a local flow) handed over: verdict %s, frame %s; want it passed to the stack untouched",
				bpftest.Describe(local.MustBytes()), kind.verdicts[res.Verdict], bpftest.Describe(res.Frame))
		}
		if res := run(live); kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(live.MustBytes()) {
			t.Errorf("%s (a remote flow) handed over: verdict %s; want it still balanced", bpftest.Describe(live.MustBytes()), kind.verdicts[res.Verdict])
		}

		// Not draining: a new flow is sluice's again.
		setFlags(cfg.Flags)
		p := bpftest.Packet{Src: client(47203), Dst: apLBTCP, Proto: bpftest.TCP, Flags: bpftest.SYN}
		if res := run(p); kind.verdicts[res.Verdict] == vDrop || string(res.Frame) == string(p.MustBytes()) {
			t.Errorf("%s after the drain flag is cleared: verdict %s; want it balanced", bpftest.Describe(p.MustBytes()), kind.verdicts[res.Verdict])
		}
	})
}
