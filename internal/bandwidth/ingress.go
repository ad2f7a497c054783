package bandwidth

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
)

// A Pod's ingress is held on the egress of its host-side veth, the last
// place its packets queue on this node. Nothing there can make a remote
// sender wait but a queue: a policer, which drops what comes faster than
// the rate, takes TCP to a quarter or half of it (the GRO-merged packets
// of a remote sender arrive tens of milliseconds of the rate at once;
// docs/bandwidth.md has the measurements). So the veth gets a qdisc:
//
//	EDT (sch_fq)  fq; tc_edt_to_pod stamps each packet from the Pod's
//	              ingress clock (drops beyond the ingress horizon, marks
//	              CE from the ECN threshold) and fq holds it till then
//	no sch_fq     TBF at the rate, a bucket of 1 to 5 ms (64 KiB, a GSO
//	              packet, where that fits) and a queue of 3 ms of the
//	              rate but at least 32 KiB (a burst that is a burst
//	              and not the bandwidth CNI plugin's 2^31 bits, a queue
//	              sized in time where the plugin's limit is 25 ms of the
//	              rate plus its burst); tc_edt_to_pod only counts
//
// The qdisc is ours by its handle (51ce:), set when the limit is and
// only when what is there differs, and deleted with the limit (the veth
// then has its default, noqueue, again).

// DefaultIngressHorizon is how far ahead a Pod's ingress is stamped before
// packets are dropped. Unlike a local sender, which TCP Small Queues holds
// back, a remote sender fills whatever waits: the horizon is the queue's
// delay bound, as TBF's latency is.
const DefaultIngressHorizon = 25 * time.Millisecond

// TBF's settings for a Pod's ingress without sch_fq. The queue is what a
// request waits behind a bulk transfer into the same Pod, so it is short
// in time (3 ms) at high rates; at low rates it holds at least 32 KiB
// (about 21 full frames: 26 ms at 10M), what TCP needs to keep the rate.
// The bucket is what passes at line rate after a pause, and adds to the
// queue's delay bound: 64 KiB (one GSO packet, which TBF would otherwise
// segment) where that is between 1 and 5 ms of the rate, else the nearer
// bound (at least two full frames).
const (
	tbfMinBurstTime = time.Millisecond
	tbfMaxBurstTime = 5 * time.Millisecond
	tbfGSOBurst     = 64 << 10
	tbfMinBurst     = 2 * 1514
	tbfQueue        = 3 * time.Millisecond
	tbfMinQueue     = 32 << 10
)

// tbfBurst is the bucket at bps bytes a second.
func tbfBurst(bps uint64) uint64 {
	of := func(d time.Duration) uint64 { return bps * uint64(d) / uint64(time.Second) }
	return max(of(tbfMinBurstTime), min(tbfGSOBurst, of(tbfMaxBurstTime)), tbfMinBurst)
}

// IngressLimitFor is the limit of a Pod's ingress at rate r under mode:
// LimitFor with the ingress horizon; under EDT, CE marks from
// EDTIngressECN.
func IngressLimitFor(mode Mode, r Rate) Limit {
	l := LimitFor(r)
	l.Horizon = DefaultIngressHorizon
	if mode == ModeEDT {
		l.ECN = max(l.ECN, EDTIngressECN(l.BytesPerSecond))
	}
	return l
}

// EDTIngressECN is where a Pod's ingress stamped for fq is marked CE at
// the least: where two 64 KiB packets wait (GRO builds them from a fast
// sender, and a remote sender whose round trip is short sends them at any
// rate), at least EDTMinECNThreshold, at most a fifth of the ingress
// horizon. From 1.25 ms (LimitFor's) a single stream held 0.89 and eight
// 0.71 of 200 Mbit/s in Debian's 6.12 under TCG, marked behind every
// packet; from 5.2 ms 0.995 and 0.95. Requests and ACKs do not wait behind
// that queue (small packets first, bw_flow_departure).
func EDTIngressECN(bytesPerSecond uint64) time.Duration {
	return min(max(Delay(2*maxTSOBytes, bytesPerSecond), EDTMinECNThreshold), DefaultIngressHorizon/5)
}

// ingressQdisc is the root qdisc veth ifindex needs for the ingress limit
// lim under mode: nil when the limit is none.
func ingressQdisc(mode Mode, ifindex int, lim Limit) netlink.Qdisc {
	if lim.BytesPerSecond == 0 {
		return nil
	}
	attrs := netlink.QdiscAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(qdiscMajor, 0)}
	if mode == ModeEDT {
		fq := newFq(ifindex, netlink.HANDLE_ROOT)
		fq.QdiscAttrs = attrs
		fq.Horizon = uint32(lim.Horizon / time.Microsecond)
		return fq
	}
	bps := lim.BytesPerSecond
	burst := tbfBurst(bps)
	limit := max(bps*uint64(tbfQueue)/uint64(time.Second), tbfMinQueue) + burst
	return &netlink.Tbf{QdiscAttrs: attrs, Rate: bps, Buffer: netlink.Xmittime(bps, uint32(burst)), Limit: uint32(min(limit, 1<<31))}
}

// sameQdisc reports whether the root qdisc have already is what want asks.
func sameQdisc(have, want netlink.Qdisc) bool {
	if have == nil || !isOurs(have) || have.Type() != want.Type() {
		return false
	}
	switch w := want.(type) {
	case *netlink.Tbf:
		h := have.(*netlink.Tbf)
		return h.Rate == w.Rate && h.Limit == w.Limit && h.Buffer == w.Buffer
	case *netlink.Fq:
		return have.(*netlink.Fq).Horizon == w.Horizon
	}
	return false
}

// syncIngressQdisc makes the root qdisc of veth ifindex what the ingress
// limit lim needs: replaced only when it differs, deleted (when ours) for
// no limit.
func (k *Kernel) syncIngressQdisc(ifindex int, lim Limit) error {
	have, err := rootQdisc(ifindex)
	if err != nil {
		return err
	}
	if k.opts.IngressPolicer {
		lim = Limit{}
	}
	want := ingressQdisc(k.opts.Mode, ifindex, lim)
	if want == nil {
		return deleteOurQdisc(ifindex, have)
	}
	if sameQdisc(have, want) {
		return nil
	}
	if err := netlink.QdiscReplace(want); err != nil {
		return fmt.Errorf("veth %d: set %s as the root qdisc for the Pod's ingress limit: %w", ifindex, want.Type(), err)
	}
	return nil
}

// deleteOurQdisc deletes root, veth ifindex's root qdisc, when it is ours.
func deleteOurQdisc(ifindex int, root netlink.Qdisc) error {
	if !isOurs(root) {
		return nil
	}
	if err := netlink.QdiscDel(root); err != nil {
		return fmt.Errorf("veth %d: delete the ingress limit's %s: %w", ifindex, root.Type(), err)
	}
	return nil
}

// removeIngressQdisc deletes our root qdisc from veth ifindex; a veth that
// is gone (its Pod deleted) is fine.
func removeIngressQdisc(ifindex int) error {
	root, err := rootQdisc(ifindex)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return deleteOurQdisc(ifindex, root)
}

// qdiscDrops is what the root qdisc of veth ifindex dropped, when ours.
func qdiscDrops(ifindex int) uint64 {
	root, err := rootQdisc(ifindex)
	if err != nil || !isOurs(root) || root.Attrs().Statistics == nil || root.Attrs().Statistics.Queue == nil {
		return 0
	}
	return uint64(root.Attrs().Statistics.Queue.Drops)
}
