package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"

	"github.com/sluice-dataplane/sluice/internal/bpftest"
	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// ctxPullLen is bpf/lib/ctx.h's CTX_PULL_LEN: at tc only that many bytes
// of a frame are sure to be in the skb's linear part, where the programs
// read; XDP reads the whole frame. nodeport.h asserts at compile time that
// no path reads deeper.
const ctxPullLen = 160

// Frames whose deepest header read reaches CTX_PULL_LEN, and longer: tc
// and XDP give the same verdict and the same output. An ICMPv4 error with
// 40 bytes of IPv4 options on its own header and on the quoted one,
// quoting a whole TCP header, whose checksum (the deepest read) ends at
// byte 160, is translated for the client. A DSR tunnel from a node whose
// IPv6 destination options header is longer than sluice's would put the
// inner packet past it: it is not sluice's tunnel and goes to the stack
// untouched on both hooks, not decapsulated.
func TestPrivilegedNorthSouthPullLen(t *testing.T) {
	outs := map[string][][]byte{}
	for _, kind := range ingressKinds {
		t.Run(kind.name, func(t *testing.T) {
			n := newNorthSouth(t)
			bpftest.InNewNetNS(t, func() { outs[kind.name] = testPullLen(t, kind, n, kind.prog(n)) })
		})
	}
	tc, xdp := outs["tc"], outs["xdp"]
	if len(tc) != len(xdp) {
		return // a subtest failed before the end
	}
	for i := range tc {
		if !bytes.Equal(tc[i], xdp[i]) {
			t.Errorf("frame %d: tc's output differs from XDP's:\ntc  %x\nxdp %x", i, tc[i], xdp[i])
		}
	}
}

func testPullLen(t *testing.T, kind attachKind, n *NorthSouth, prog *ebpf.Program) [][]byte {
	var outs [][]byte
	run := func(name string, in, want bpftest.Frame) {
		t.Helper()
		frame := bpftest.Must(in)
		res, err := bpftest.Run(prog, frame)
		must(t, err)
		if kind.verdicts[res.Verdict] != vPass {
			t.Errorf("%s: verdict %d, want pass", name, res.Verdict)
		}
		if w := bpftest.Must(want); !bytes.Equal(res.Frame, w) {
			t.Errorf("%s: output\n%x\nwant\n%x", name, res.Frame, w)
		}
		outs = append(outs, res.Frame)
	}

	nops := make([]layers.IPv4Option, 40) // 40 one-byte NOPs: IHL 15
	for i := range nops {
		nops[i] = layers.IPv4Option{OptionType: 1}
	}
	flow := tcpSyn(client(46100), apLBTCP)
	if _, err := bpftest.Run(prog, flow.MustBytes()); err != nil {
		t.Fatal(err)
	}
	port := natPort(t, n, flow.Src, apRemote, flow.Proto)
	sent := flow.With(func(p *bpftest.Packet) {
		p.Src, p.Dst, p.IPOptions = netip.AddrPortFrom(ipNode, port), apRemote, nops
	})
	in := bpftest.ICMPError{Src: apRemote.Addr(), Dst: ipNode, Type: bpftest.ICMPDestUnreach,
		Code: bpftest.ICMPPortUnreach, Quote: sent, IPOptions: nops}
	if l := len(bpftest.Must(in)); l <= ctxPullLen {
		t.Fatalf("the ICMP error is %d bytes, not past CTX_PULL_LEN", l)
	}
	want := in.With(func(e *bpftest.ICMPError) {
		e.Src, e.Dst = flow.Dst.Addr(), flow.Src.Addr()
		e.Quote = flow.With(func(p *bpftest.Packet) { p.IPOptions = nops })
	})
	run("ICMPv4 error, options on both headers, whole TCP header quoted", in, want)

	// A node's IPv6 tunnel whose destination options header is 128 bytes
	// (sluice's is 24), naming the backend as sluice's does.
	setMode(t, n, lbmap.ModeDSR)
	nodesViaLo(t)
	opts := make([]byte, 128)
	copy(opts, bpftest.DSROptions6(apLocal6)[:22])
	opts[1] = 128/8 - 1
	opts[22], opts[23] = 1, 128-24 // PadN over the rest
	binary.BigEndian.PutUint16(opts[4:], apLocal6.Port())
	long := bpftest.Encap{Src: ipNode2v6, Dst: ipNode6, Options6: opts,
		Inner: tcpSyn(client6(46101), netip.AddrPortFrom(ipNode2v6, 30080))}
	if l := len(bpftest.Must(long)); l <= ctxPullLen {
		t.Fatalf("the tunnelled frame is %d bytes, not past CTX_PULL_LEN", l)
	}
	run("IPv6 tunnel from a node with a 128-byte destination options header", long, long)
	if _, ok := flowEntry(t, n, long.Inner.Src, long.Inner.Dst, apLocal6, bpftest.TCP); ok {
		t.Errorf("the long tunnel made a conntrack entry")
	}
	return outs
}
