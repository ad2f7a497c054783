/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Sending a translated packet on its way, for nodeport.h: the FIB's
 * answer (ns_fib, fib.h) turned into a redirect, an XDP_TX, the next hop's
 * MACs, or the stack; a DSR packet in its outer header; an established
 * masqueraded flow's packet from the flow cache (ns_cached). */
#ifndef __SLUICE_NS_SEND_H
#define __SLUICE_NS_SEND_H

#include "lb.h"
#include "ct.h"
#include "nat.h"
#include "fib.h"
#include "dsr.h"
#ifndef SLUICE_POD_LB
#include "flowcache.h"
#endif /* SLUICE_POD_LB */

enum {
	FWD_ROUTE, /* to another host: TTL decremented */
	FWD_LOCAL, /* to a pod on this node */
	FWD_ENCAP, /* in an outer header this node just made */
	/* A pod's hairpin flow whose frontend, now its source, is this
	 * node's address (a NodePort or hostPort reached by the pod LB):
	 * never through the stack, which drops a packet from a pod's veth
	 * with a local address as its source (a martian). */
	FWD_LOCAL_DIRECT,
};

/* ns_set_macs writes the next hop's and the egress device's MACs into the
 * frame. */
static __always_inline int ns_set_macs(struct __ctx_buff *ctx, const __u8 *dmac,
				       const __u8 *smac)
{
	if (ctx_store_bytes(ctx, 0, dmac, ETH_ALEN))
		return -1;
	return ctx_store_bytes(ctx, ETH_ALEN, smac, ETH_ALEN);
}

/* ns_xmit sends a routed packet to a next hop whose MACs are known, out of
 * ifindex: XDP_TX when that is the device it came in on (XDP). */
static __always_inline int ns_xmit(struct __ctx_buff *ctx, __u32 ifindex, const __u8 *dmac,
				   const __u8 *smac)
{
	if (ns_set_macs(ctx, dmac, smac))
		return CTX_ACT_DROP;
#ifdef SLUICE_XDP
	if (ifindex == ctx_ifindex(ctx))
		return CTX_ACT_TX;
#endif /* SLUICE_XDP */
	return bpf_redirect(ifindex, 0);
}

#ifdef SLUICE_XDP
/* ns_xdp_defers: XDP translates only what it sends itself. It leaves the
 * packet to tc untouched (XDP_PASS; tc's program does all of it, state
 * included, and sends by bpf_redirect_neigh) when the FIB's answer (rc,
 * fib: asked before any translation) is one XDP cannot send by: the next
 * hop has no neighbour entry (translated and passed, the packet would
 * reach the stack with this node's address as its source, a martian, and
 * no neighbour would ever be resolved), or the egress device is not one
 * XDP may redirect to (ns_xdp_tx). The device it came in on is XDP_TX's.
 * Any other failure (no route, forwarding off) the stack answers for,
 * translated as tc passes it. */
static __always_inline bool ns_xdp_defers(struct __ctx_buff *ctx, long rc,
					  const struct bpf_fib_lookup *fib)
{
	__u32 ifindex;

	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return true;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != NS_FIB_KEPT)
		return false;
	ifindex = fib->ifindex;
	return ifindex != ctx_ifindex(ctx) && !bpf_map_lookup_elem(&ns_xdp_tx, &ifindex);
}
#define NS_XDP_DEFERS(ctx, rc, fib) ns_xdp_defers(ctx, rc, fib)
#else
#define NS_XDP_DEFERS(ctx, rc, fib) false
#endif /* SLUICE_XDP */

/* ns_send sends a translated packet on its way (how: FWD_*) by the FIB's
 * answer (rc, fib). Whatever the FIB cannot resolve goes to the stack,
 * which routes, resolves neighbours and answers with ICMP errors. */
static __always_inline int ns_send(struct __ctx_buff *ctx, const struct ns_pkt *p,
				   int how, const struct bpf_fib_lookup *fib, long rc)
{
#ifdef SLUICE_POD_LB
	bool local = how == FWD_LOCAL || how == FWD_LOCAL_DIRECT;
#else
	bool local = how == FWD_LOCAL; /* FWD_LOCAL_DIRECT is the pod LB's */
#endif /* SLUICE_POD_LB */
	bool dec_ttl = how != FWD_ENCAP;

#ifdef SLUICE_TC
	if (local) {
		__u32 ifindex = fib->ifindex;

		/* redirect_peer (5.10) skips the host stack, but only into
		 * a veth the agent listed: it drops on any other device. */
		if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != NS_FIB_KEPT) ||
		    !bpf_map_lookup_elem(&ns_pod_ifaces, &ifindex))
			return CTX_ACT_OK;
		if ((dec_ttl && ns_dec_ttl(ctx, p)) || ns_set_macs(ctx, fib->dmac, fib->smac))
			return CTX_ACT_DROP;
		return bpf_redirect_peer(ifindex, 0);
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
	    rc != NS_FIB_KEPT)
		return CTX_ACT_OK;
	if (dec_ttl && ns_dec_ttl(ctx, p))
		return CTX_ACT_OK;
	if (rc == NS_FIB_KEPT) /* the flow's kept result: no route or neighbour lookup */
		return ns_xmit(ctx, fib->ifindex, fib->dmac, fib->smac);
	/* After a lookup (a flow's first packet in each CT second, or one
	 * with nothing kept), redirect_neigh (5.10) goes through the
	 * neighbour output: it resolves a neighbour the FIB had none for,
	 * and keeps a known one confirmed (a STALE one is probed), which
	 * packets sent with the kept MACs alone would never do. */
	return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
#else /* SLUICE_XDP */
	if (local || (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != NS_FIB_KEPT))
		return CTX_ACT_OK;
	if (dec_ttl && ns_dec_ttl(ctx, p))
		return CTX_ACT_OK;
	return ns_xmit(ctx, fib->ifindex, fib->dmac, fib->smac);
#endif /* SLUICE_TC */
}

/* ns_forward sends a translated packet on its way (ns_fib, ns_send). */
static __always_inline int ns_forward(struct __ctx_buff *ctx, const struct ns_pkt *p,
				      int how, struct ct_entry *keep, __u32 now)
{
	struct bpf_fib_lookup *fib = ns_fib_buf();
	const struct ns_config *cfg;
	long rc;

	if (!fib)
		return CTX_ACT_DROP;
#ifdef SLUICE_XDP
	/* XDP hands every local delivery to the stack (ns_send), whatever
	 * the route: none to look up (--local-delivery=peer is tc's). */
	if (how == FWD_LOCAL)
		return CTX_ACT_OK;
#endif /* SLUICE_XDP */
	/* Through the host's stack: no route to look up here. */
	if (how == FWD_LOCAL && (cfg = ns_cfg()) && (cfg->flags & NS_CFG_LOCAL_VIA_STACK))
		return CTX_ACT_OK;
	rc = ns_fib(ctx, p, &p->saddr, p->sport, &p->daddr, p->dport, keep, now, fib);
	return ns_send(ctx, p, how, fib, rc);
}

/* ns_dsr_forward sends p (client -> frontend, untouched) to the node of
 * backend in an outer header from this node. The outer packet's route is
 * asked first: a packet that would not fit its egress device's MTU with
 * the outer header is answered (dsr_reply_too_big), whichever device it
 * came in on. When the FIB knows no route (the stack will route it), the
 * device it came in on is the guess. */
static __always_inline int ns_dsr_forward(struct __ctx_buff *ctx, struct ns_pkt *p,
					  const struct ns_config *cfg,
					  const union lb_addr *backend, __be16 port)
{
	union lb_addr node __align_stack_8;
	union lb_addr src __align_stack_8;
	struct bpf_fib_lookup *fib = ns_fib_buf();
	__u32 hlen = dsr_overhead(p, cfg), mtu;
	struct ct_scratch *s;
	long rc;

	/* The outer source is this node's configured address, which every
	 * node knows as a node's (dsr_from_node), whichever local address the
	 * client used: NodePorts answer on addresses no Node object lists. */
	src = *snat_conf_addr(cfg, p->v6);
	if (!fib || addr_is_any(&src) || !dsr_tunnel_endpoint(backend, &node))
		return CTX_ACT_DROP;
	/* The outer header's length is 16 bits: a BIG TCP aggregate (tc, GRO
	 * over 64 KiB) does not fit it. */
	if (ctx_len(ctx) - p->l3_off > 0xffff - hlen)
		return NS_DROP(SL_DROP_DSR_TOO_LONG);
	rc = ns_fib_tunnel(ctx, p, &src, &node,
			   dsr_gue_on(cfg) ? IPPROTO_UDP : p->v6 ? IPPROTO_IPV6 : IPPROTO_IPIP, hlen, fib);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return fib->mtu_result > hlen ? dsr_reply_too_big(ctx, p, fib->mtu_result - hlen) :
						CTX_ACT_DROP;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && (mtu = dsr_mtu(ctx, hlen)))
		return dsr_reply_too_big(ctx, p, mtu);
	/* Passed in its outer header, it would come from this node: tc's. */
	if (NS_XDP_DEFERS(ctx, rc, fib))
		return CTX_ACT_OK;
	s = ns_scratch();
	if (!s)
		return CTX_ACT_DROP;
	s->dsr.info.node = node;
	s->dsr.info.backend = *backend;
	s->dsr.info.port = port;
	if (dsr_encap(ctx, p))
		return CTX_ACT_DROP;
	return ns_send(ctx, p, FWD_ENCAP, fib, rc);
}


#ifndef SLUICE_POD_LB
/* ns_cached sends p (before translation, len bytes; TCP or UDP with its
 * L4 header) as the flow cache's entry f for it says: both sides
 * rewritten, the TTL decremented, out with the MACs of the FIB result its
 * flow kept this CT second. IPv4 reads f's first cache line only; IPv6
 * puts the whole addresses together in the scratch's tuple. */
static __always_inline int ns_cached(struct __ctx_buff *ctx, struct ns_pkt *p,
				     struct ns_flow *f, __u32 len)
{
	struct ct_scratch *s;
	int ret;

	if (!p->v6) {
		ret = pkt_rewrite_nat4(ctx, p, f->to_daddr_lo, f->to_dport, f->to_saddr_lo,
				       f->to_sport, true);
		if (ret < 0)
			return CTX_ACT_DROP;
	} else {
		s = ns_scratch();
		if (!s)
			return CTX_ACT_DROP;
		fc_addr(s->tuple.saddr, f->to_saddr_hi, f->to_saddr_lo);
		fc_addr(s->tuple.daddr, f->to_daddr_hi, f->to_daddr_lo);
		if (pkt_rewrite_nat(ctx, p, (const union lb_addr *)s->tuple.daddr, f->to_dport,
				    (const union lb_addr *)s->tuple.saddr, f->to_sport))
			return CTX_ACT_DROP;
		ret = ns_dec_ttl(ctx, p) ? 1 : 0;
	}
	f->packets++;
	f->bytes += len;
	if (ret)
		return CTX_ACT_OK;
	return ns_xmit(ctx, f->fib.ifindex, f->fib.dmac, f->fib.smac);
}
#endif /* SLUICE_POD_LB */

#endif /* __SLUICE_NS_SEND_H */
