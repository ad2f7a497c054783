// Package nfexport hands sluice's live north-south flows to netfilter's
// conntrack when sluice is uninstalled: the way back to kube-proxy with
// nothing broken (docs/install.md). For each flow its BPF conntrack
// translates (client -> frontend, DNAT to the backend, a masqueraded
// one's SNAT to the node's nat port), an nf_conntrack entry with the same
// NAT bindings, established: once sluice's programs detach, the flow's
// packets reach netfilter, which translates them as sluice did instead of
// balancing them anew through kube-proxy's rules (a RST). The mirror of
// the way in (bpf/lib/nfct.h), where sluice leaves netfilter's flows to it.
package nfexport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sluice-dataplane/sluice/internal/lbmap"
)

// Flow is one flow to hand over: Orig as the client sends it, the
// backend it goes to (DNAT), and the source the backend sees when that is
// not the client's (SNAT: the node's nat port, or the client's address
// with another port).
type Flow struct {
	Proto       uint8
	Client      netip.AddrPort
	Frontend    netip.AddrPort
	Backend     netip.AddrPort
	SNAT        netip.AddrPort // zero: none
	TimeoutSecs uint32
	Established bool // TCP: in ESTABLISHED (else only UDP)
}

func (f Flow) String() string {
	s := fmt.Sprintf("%d %s -> %s DNAT %s", f.Proto, f.Client, f.Frontend, f.Backend)
	if f.SNAT.IsValid() {
		s += " SNAT " + f.SNAT.String()
	}
	return s
}

// Timeouts of the handed-over entries: conntrack's established TCP
// timeout (5 days, netfilter's default; the flow's own traffic keeps it)
// and a UDP stream's.
const (
	TCPTimeout = 5 * 24 * 3600
	UDPTimeout = 120
)

// Flows picks, from a dump of the BPF conntrack at CT second now, the
// flows to hand over: service entries of TCP and UDP flows that live, TCP
// ones established and not closing; not DSR ones (the LB node keeps no
// reply path to give netfilter). snat4 and snat6 are the node's nat
// addresses (ns_config's SNATAddr4/6).
func Flows(recs []lbmap.CTRecord, now uint32, snat4, snat6 netip.Addr) []Flow {
	var out []Flow
	for _, r := range recs {
		k, e := r.Key, r.Entry
		if k.Dir != lbmap.CTDirService || e.Lifetime < now || e.Flags&lbmap.CTFlagDSR != 0 {
			continue
		}
		f := Flow{Proto: k.Proto,
			Client:   netip.AddrPortFrom(k.SAddr.NetIP(), k.SPort.Host()),
			Frontend: netip.AddrPortFrom(k.DAddr.NetIP(), k.DPort.Host()),
			Backend:  netip.AddrPortFrom(e.NATAddr.NetIP(), e.NATPort.Host())}
		switch k.Proto {
		case unix.IPPROTO_TCP:
			if e.Flags&(lbmap.CTFlagEstablished|lbmap.CTFlagClosing|lbmap.CTFlagNew) != lbmap.CTFlagEstablished {
				continue
			}
			f.Established, f.TimeoutSecs = true, TCPTimeout
		case unix.IPPROTO_UDP:
			f.TimeoutSecs = UDPTimeout
		default:
			continue
		}
		switch {
		case e.Flags&lbmap.CTFlagSPort != 0 && e.SNATPort != 0:
			// The backend knows the client by another port.
			f.SNAT = netip.AddrPortFrom(f.Client.Addr(), e.SNATPort.Host())
		case e.Flags&lbmap.CTFlagHairpin != 0:
			f.SNAT = netip.AddrPortFrom(f.Frontend.Addr(), f.Client.Port())
		case e.Flags&lbmap.CTFlagSNAT != 0:
			if e.SNATPort == 0 {
				continue // its nat port not known to the entry: cannot say
			}
			src := snat4
			if f.Client.Addr().Is6() {
				src = snat6
			}
			if e.Flags&lbmap.CTFlagSNATFE != 0 {
				src = f.Frontend.Addr()
			}
			if !src.IsValid() {
				continue
			}
			f.SNAT = netip.AddrPortFrom(src, e.SNATPort.Host())
		}
		out = append(out, f)
	}
	return out
}

// Result counts what Create did.
type Result struct {
	Created, Existed, Failed int
	FirstErr                 error
}

// Create writes each flow into the calling thread's network namespace's
// conntrack; one netfilter has already (a flow made again, or handed over
// before) counts as existed. A flow to a local backend that sluice handed
// to the stack after its DNAT (--local-delivery=stack, and XDP) is in
// conntrack already under its translated tuple, client to backend, with
// no NAT: those entries go first (one pass over the table), or the NAT
// setup would give the handed-over flow another client port to keep its
// reply tuple apart, which the backend does not know.
func Create(flows []Flow) Result {
	var r Result
	translated := translatedSet{}
	for _, f := range flows {
		if !f.SNAT.IsValid() {
			translated[tupleKey{f.Proto, f.Client, f.Backend}] = true
		}
	}
	if len(translated) > 0 {
		for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
			if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, translated); err != nil && r.FirstErr == nil {
				r.FirstErr = fmt.Errorf("delete the translated entries of local flows: %w", err)
			}
		}
	}
	for _, f := range flows {
		err := create(f)
		// A local flow's packet may have made its translated entry again
		// since (sluice serves until its programs detach): it goes, once.
		if errors.Is(err, unix.EEXIST) && !f.SNAT.IsValid() && deleteTranslated(f) {
			err = create(f)
		}
		// A masqueraded flow's tuple held by another binding: an earlier
		// connection from the same client port, netfilter's since the
		// migration in (closing, in TIME_WAIT), which would send the live
		// flow's packets to its backend. The live flow is sluice's: its
		// binding replaces it. One written by the pass before is left.
		if errors.Is(err, unix.EEXIST) && f.SNAT.IsValid() && deleteOtherBinding(f) {
			err = create(f)
		}
		switch {
		case err == nil:
			r.Created++
		case errors.Is(err, unix.EEXIST):
			r.Existed++
		default:
			r.Failed++
			if r.FirstErr == nil {
				r.FirstErr = fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return r
}

// deleteTranslated deletes conntrack's entry of f's packets after
// sluice's DNAT (client to backend): true when one went. A pass over the
// table: for the rare clash, after Create's one pass for all.
func deleteTranslated(f Flow) bool {
	family := netlink.InetFamily(unix.AF_INET)
	if f.Client.Addr().Is6() {
		family = unix.AF_INET6
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family,
		translatedSet{tupleKey{f.Proto, f.Client, f.Backend}: true})
	return err == nil && n > 0
}

// deleteOtherBinding deletes conntrack's entry of f's original tuple when
// its reply is not f's (from the backend to the nat port): true when one
// went.
func deleteOtherBinding(f Flow) bool {
	family := netlink.InetFamily(unix.AF_INET)
	if f.Client.Addr().Is6() {
		family = unix.AF_INET6
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, otherBinding{f})
	return err == nil && n > 0
}

// otherBinding matches the entry of f's original tuple whose reply tuple
// differs from f's.
type otherBinding struct{ f Flow }

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (o otherBinding) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	at := func(ip net.IP, port uint16) netip.AddrPort {
		a, _ := netip.AddrFromSlice(ip)
		return netip.AddrPortFrom(a.Unmap(), port)
	}
	f := o.f
	return c.Forward.Protocol == f.Proto && at(c.Forward.SrcIP, c.Forward.SrcPort) == f.Client &&
		at(c.Forward.DstIP, c.Forward.DstPort) == f.Frontend &&
		(at(c.Reverse.SrcIP, c.Reverse.SrcPort) != f.Backend || at(c.Reverse.DstIP, c.Reverse.DstPort) != f.SNAT)
}

// tupleKey is a conntrack entry's original tuple.
type tupleKey struct {
	proto    uint8
	src, dst netip.AddrPort
}

// translatedSet matches the entries whose original tuple it holds.
type translatedSet map[tupleKey]bool

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (s translatedSet) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	src, ok1 := netip.AddrFromSlice(f.Forward.SrcIP)
	dst, ok2 := netip.AddrFromSlice(f.Forward.DstIP)
	return ok1 && ok2 && s[tupleKey{f.Forward.Protocol,
		netip.AddrPortFrom(src.Unmap(), f.Forward.SrcPort), netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort)}]
}

// Netlink attribute types of nfnetlink_conntrack.h and nf_conntrack_tcp.h
// the vishvananda/netlink package does not name.
const (
	ctaNATSrc           = 6
	ctaNATDst           = 13
	ctaNATV4MinIP       = 1
	ctaNATV4MaxIP       = 2
	ctaNATProto         = 3
	ctaNATV6MinIP       = 4
	ctaNATV6MaxIP       = 5
	ctaProtoNATPortMin  = 1
	ctaProtoNATPortMax  = 2
	tcpConntrackEstabl  = 3
	ctaProtoinfoTCP     = 1
	ctaProtoinfoTCPStat = 1
	// CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, _REPLY: struct nf_ct_tcp_flags
	// {flags, mask}; IP_CT_TCP_FLAG_*.
	ctaProtoinfoTCPFlagsOrig  = 4
	ctaProtoinfoTCPFlagsReply = 5
	ipCTTCPFlagSackPerm       = 0x02
	ipCTTCPFlagBeLiberal      = 0x08
)

func create(f Flow) error {
	family := uint8(unix.AF_INET)
	if f.Client.Addr().Is6() {
		family = unix.AF_INET6
	}
	req := nl.NewNetlinkRequest((unix.NFNL_SUBSYS_CTNETLINK<<8)|nl.IPCTNL_MSG_CT_NEW,
		unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	orig := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_ORIG, nil)
	for _, a := range tuple(f.Proto, f.Client, f.Frontend) {
		orig.AddChild(a)
	}
	req.AddData(orig)
	// The reply tuple as without NAT, the original's inverse (as
	// conntrack -I sends it): the NAT setup below makes it what the
	// backend sends back. One with the NAT in it already fails (EBUSY).
	reply := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_REPLY, nil)
	for _, a := range tuple(f.Proto, f.Frontend, f.Client) {
		reply.AddChild(a)
	}
	req.AddData(reply)
	req.AddData(natAttr(ctaNATDst, f.Backend))
	// Without SNAT, the client's own address and port, pinned: left
	// free, the NAT setup gives the flow another client port when its
	// reply tuple is taken (by the translated entry a local flow's packet
	// made meanwhile), which the backend does not know: a RST (1 of 60 in
	// the migration test). Pinned, the clash fails the create (EEXIST).
	src := f.SNAT
	if !src.IsValid() {
		src = f.Client
	}
	req.AddData(natAttr(ctaNATSrc, src))
	// No CTA_STATUS: the NAT setup above has set bits of it already, and
	// a status without them is refused (EBUSY). The flow's next reply sets
	// SEEN_REPLY and ASSURED.
	req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, nl.BEUint32Attr(f.TimeoutSecs)))
	if f.Established {
		info := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_PROTOINFO, nil)
		tcp := nl.NewRtAttr(unix.NLA_F_NESTED|ctaProtoinfoTCP, nil)
		tcp.AddChild(nl.NewRtAttr(ctaProtoinfoTCPStat, []byte{tcpConntrackEstabl}))
		// Liberal window tracking both ways, as for a connection
		// netfilter picks up mid-stream: the window scale was in the
		// SYNs it never saw.
		flags := []byte{ipCTTCPFlagBeLiberal | ipCTTCPFlagSackPerm, ipCTTCPFlagBeLiberal | ipCTTCPFlagSackPerm}
		tcp.AddChild(nl.NewRtAttr(ctaProtoinfoTCPFlagsOrig, flags))
		tcp.AddChild(nl.NewRtAttr(ctaProtoinfoTCPFlagsReply, flags))
		info.AddChild(tcp)
		req.AddData(info)
	}
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	return err
}

func tuple(proto uint8, src, dst netip.AddrPort) []*nl.RtAttr {
	s, d := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if src.Addr().Is6() {
		s, d = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	ip := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	ip.AddChild(nl.NewRtAttr(s, src.Addr().AsSlice()))
	ip.AddChild(nl.NewRtAttr(d, dst.Addr().AsSlice()))
	p := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
	p.AddChild(nl.NewRtAttr(nl.CTA_PROTO_NUM, []byte{proto}))
	p.AddChild(nl.NewRtAttr(nl.CTA_PROTO_SRC_PORT, nl.BEUint16Attr(src.Port())))
	p.AddChild(nl.NewRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(dst.Port())))
	return []*nl.RtAttr{ip, p}
}

// natAttr is a CTA_NAT_SRC or CTA_NAT_DST of one address and port.
func natAttr(typ int, to netip.AddrPort) *nl.RtAttr {
	minT, maxT := ctaNATV4MinIP, ctaNATV4MaxIP
	if to.Addr().Is6() {
		minT, maxT = ctaNATV6MinIP, ctaNATV6MaxIP
	}
	a := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
	a.AddChild(nl.NewRtAttr(minT, to.Addr().AsSlice()))
	a.AddChild(nl.NewRtAttr(maxT, to.Addr().AsSlice()))
	p := nl.NewRtAttr(unix.NLA_F_NESTED|ctaNATProto, nil)
	p.AddChild(nl.NewRtAttr(ctaProtoNATPortMin, nl.BEUint16Attr(to.Port())))
	p.AddChild(nl.NewRtAttr(ctaProtoNATPortMax, nl.BEUint16Attr(to.Port())))
	a.AddChild(p)
	return a
}
