/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The entry points of the north-south programs (tc_lb.c, xdp_lb.c,
 * tc_pod.c): every packet of an external device is parsed here and sent to
 * its path, the service path (nodeport_lb, nodeport.h), the reply paths
 * (ns_reply.h), or one of the stages, the rare subpaths that run as
 * programs of their own (ICMP errors, the DSR backend node's tunnel); on
 * tc egress a local backend's reply gets its frontend back. */
#ifndef __SLUICE_NS_ENTRY_H
#define __SLUICE_NS_ENTRY_H

#include "nodeport.h"

/* nodeport_icmp_ingress translates an ICMP error about a tracked flow:
 * from a remote backend's side about a masqueraded flow, for the client;
 * from the client's side about a reply, for the backend. */
static __always_inline int nodeport_icmp_ingress(struct __ctx_buff *ctx, struct ns_pkt *p)
{
	struct ct_scratch *s = ns_scratch();
	bool local = false;
	int ret = 0;

	if (!s || icmp_parse_error(ctx, p, &s->icmp) != PARSE_OK)
		return CTX_ACT_OK;
	if (lb_is_node_addr(&p->daddr))
		ret = icmp_rev_snat(ctx, p, &s->icmp);
	if (ret == 0)
		ret = icmp_to_backend(ctx, p, &s->icmp, &local);
	if (ret == 0)
		return CTX_ACT_OK;
	/* About a DSR flow's reply: to the backend's node, in the tunnel its
	 * packets take, the error untouched (that node translates it). */
	if (ret == 2) {
		const struct ns_config *cfg = ns_cfg();

		return cfg ? ns_dsr_forward(ctx, p, cfg, (const union lb_addr *)s->nat.to_addr,
					    s->nat.to_port) : CTX_ACT_DROP;
	}
	if (ret < 0)
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, local ? FWD_LOCAL : FWD_ROUTE, NULL, 0);
}

/* nodeport_dsr_backend handles a DSR packet from an LB node. */
static __always_inline int nodeport_dsr_backend(struct __ctx_buff *ctx, struct ns_pkt *p,
						const struct ns_config *cfg)
{
	struct dsr_info *d = dsr_decap(ctx, p);

	if (!d)
		return NS_DROP(SL_DROP_MALFORMED);
	/* An ICMP error about a reply of a flow (the LB node's
	 * nodeport_icmp_ingress sent it on), decapsulated: the ICMP path
	 * translates it for the backend as any error from the client's
	 * side, on its next pass. XDP passes it to tc; tc puts it back into
	 * this device's ingress. Not translated here: a second inlined ICMP
	 * path cost the verifier ~120K instructions, for a rare packet. */
	if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6)
#ifdef SLUICE_XDP
		return CTX_ACT_OK;
#else
		return bpf_redirect(ctx_field(ctx, ifindex), BPF_F_INGRESS);
#endif /* SLUICE_XDP */
	/* Only what a DSR LB node sends: TCP, and UDP unless hybrid mode
	 * (which masquerades UDP). nodeport_lb then takes only a frontend of
	 * a Service with a local backend. */
	if (p->proto != IPPROTO_TCP &&
	    (p->proto != IPPROTO_UDP || cfg->mode == NS_MODE_HYBRID))
		return NS_DROP(SL_DROP_MALFORMED);
	return nodeport_lb(ctx, p, cfg, d);
}

/* ns_vlan_tagged: at tc, the frame carries a VLAN tag (in the skb's
 * metadata: the stack takes the tag off before tc runs, and puts it back on
 * after tc egress). Such a frame belongs to that VLAN's device, where these
 * programs see it untagged when --devices names it (eth0.100); on the
 * parent device it is the stack's, which hands it to the VLAN device.
 * XDP sees the tag in the frame and parse_pkt leaves it to the stack:
 * native XDP runs on the parent only, a VLAN device has generic XDP. */
static __always_inline bool ns_vlan_tagged(struct __ctx_buff *ctx)
{
#if defined(SLUICE_TC) && !defined(SLUICE_POD_LB)
	/* A priority tag (VLAN ID 0) is the parent device's: 802.1p. */
	return ctx_field(ctx, vlan_present) && (ctx_field(ctx, vlan_tci) & 0x0fff);
#else
	return false;
#endif
}

#ifndef SLUICE_POD_LB
/* ns_tunnel_rpf: the DSR tunnel packet p, from a node's address
 * (dsr_from_node), came the way this node's route back to that address
 * leads: in on the device the route leaves by, and from the MAC of its
 * next hop (that node, or the router before it), when the neighbour is
 * known. A host on the node network that puts a node's address on its
 * own packets fails the second, one behind another device the first
 * (docs/dsr-security.md). One FIB lookup per tunnelled packet, on backend
 * nodes only. A function of its own: its MAC stays out of the service
 * path's frame. */
static __noinline bool ns_tunnel_rpf(struct __ctx_buff *ctx, const struct ns_pkt *p)
{
	struct bpf_fib_lookup *fib = ns_fib_buf();
	__u8 smac[ETH_ALEN];
	long rc;

	if (!fib || !p)
		return false;
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->ifindex = ctx_ifindex(ctx);
	ns_fib_addrs(fib, p->v6, &p->daddr, &p->saddr);
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return false;
	if (fib->ifindex != ctx_ifindex(ctx))
		return false;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return true;
	if (ctx_load_bytes(ctx, ETH_ALEN, smac, ETH_ALEN))
		return false;
	return !__builtin_memcmp(smac, fib->dmac, ETH_ALEN);
}
#endif /* SLUICE_POD_LB */

#ifndef SLUICE_POD_LB
/* Stages: the two large subpaths that few packets take, the ICMP errors
 * and the DSR backend node's tunnel, run as programs of their own, reached
 * by tail call from the service path's program through a prog array each
 * object fills as it loads (static values, pinned so that it keeps its
 * programs while the agent restarts). The verifier then walks each once,
 * from its own entry, instead of once for every way the service path can
 * reach it: a feature costs its own subtree (docs/kernels.md). A stage
 * parses the packet again (the frame is untouched until then) and gives
 * its own verdict. A tail call that finds no program (the array emptied
 * by hand) falls through to the caller's verdict for it. */
enum {
	NS_STAGE_ICMP,        /* nodeport_icmp_ingress */
	NS_STAGE_DSR_BACKEND, /* nodeport_dsr_backend */
	NS_STAGES,
};

#ifdef SLUICE_XDP
#define NS_STAGE_SEC "xdp"
#define ns_stage_icmp xdp_lb_icmp
#define ns_stage_dsr_backend xdp_lb_dsr_backend
#define ns_stages xdp_lb_stages
#else
#define NS_STAGE_SEC "tc"
#define ns_stage_icmp tc_lb_icmp
#define ns_stage_dsr_backend tc_lb_dsr_backend
#define ns_stages tc_lb_stages
#endif /* SLUICE_XDP */

int ns_stage_icmp(struct __ctx_buff *ctx);
int ns_stage_dsr_backend(struct __ctx_buff *ctx);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, NS_STAGES);
	__uint(key_size, sizeof(__u32));
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, int(struct __ctx_buff *));
} ns_stages SEC(".maps") = {
	.values = {
		[NS_STAGE_ICMP] = (void *)&ns_stage_icmp,
		[NS_STAGE_DSR_BACKEND] = (void *)&ns_stage_dsr_backend,
	},
};

/* ns_stage continues in stage; missing is the verdict when the array has
 * no program for it. */
static __always_inline int ns_stage(struct __ctx_buff *ctx, __u32 stage, int missing)
{
	bpf_tail_call(ctx, &ns_stages, stage);
	return missing;
}
#endif /* SLUICE_POD_LB */

/* nodeport_dispatch sends a parsed packet to its path. */
static __always_inline int nodeport_dispatch(struct __ctx_buff *ctx, struct ns_pkt *p,
					     const struct ns_config *cfg)
{
#ifndef SLUICE_POD_LB
	if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6)
		return ns_stage(ctx, NS_STAGE_ICMP, CTX_ACT_OK);
	/* DSR tunnels only in a DSR mode and from the cluster's nodes: in
	 * SNAT mode no node sends one, and the stack has them; anyone who
	 * can spoof a node's address would reach the pods through it. */
	if (dsr_is_tunnel(p, cfg)) {
		if (cfg->mode == NS_MODE_SNAT)
			return CTX_ACT_OK;
		if (dsr_from_node(p))
			return ns_tunnel_rpf(ctx, p) ?
			       ns_stage(ctx, NS_STAGE_DSR_BACKEND, NS_DROP(SL_DROP_UNKNOWN)) :
			       NS_DROP(SL_DROP_DSR_SPOOFED);
		/* GUE to the port, an outer header with an option (IPv4) or a
		 * destination options header (IPv6) is how sluice's DSR names
		 * the backend: ours, from no node. Any other tunnel is the
		 * stack's. */
		return dsr_is_gue(p, cfg) ||
		       p->l4_off - p->l3_off > (p->v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr)) ?
		       NS_DROP(SL_DROP_DSR_UNKNOWN_NODE) : CTX_ACT_OK;
	}
#endif /* SLUICE_POD_LB */
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return CTX_ACT_OK;
	return nodeport_lb(ctx, p, cfg, NULL);
}

/* nodeport_ingress runs on every packet entering an external device. */
static __always_inline int nodeport_ingress(struct __ctx_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();
	struct ns_pkt p;

	if (!cfg || ns_vlan_tagged(ctx) || ctx_linearize(ctx))
		return CTX_ACT_OK;
	switch (parse_pkt(ctx, &p)) {
	case PARSE_OK:
		break;
	case PARSE_DROP:
		return ns_verdict(ctx, &p, NS_DROP(SL_DROP_MALFORMED), SL_HOOK_THIS);
	default:
		return CTX_ACT_OK;
	}
	return ns_verdict(ctx, &p, nodeport_dispatch(ctx, &p, cfg), SL_HOOK_THIS);
}

#ifndef SLUICE_POD_LB
/* The stages' programs (ns_stages): the packet nodeport_dispatch sent
 * here, parsed again. */
SEC(NS_STAGE_SEC)
int ns_stage_icmp(struct __ctx_buff *ctx)
{
	struct ns_pkt p;

	if (ctx_linearize(ctx) || parse_pkt(ctx, &p) != PARSE_OK)
		return CTX_ACT_OK;
	return ns_verdict(ctx, &p, nodeport_icmp_ingress(ctx, &p), SL_HOOK_THIS);
}

SEC(NS_STAGE_SEC)
int ns_stage_dsr_backend(struct __ctx_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();
	struct ns_pkt p;

	if (!cfg || ctx_linearize(ctx) || parse_pkt(ctx, &p) != PARSE_OK)
		return CTX_ACT_OK;
	return ns_verdict(ctx, &p, nodeport_dsr_backend(ctx, &p, cfg), SL_HOOK_THIS);
}
#endif /* SLUICE_POD_LB */

#ifdef SLUICE_TC
/* nodeport_egress runs on every packet leaving an external device: a local
 * backend's reply, or its ICMP error, gets its frontend back. */
static __always_inline int nodeport_egress(struct __ctx_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();
	struct ns_pkt p;

	if (!cfg || ns_vlan_tagged(ctx) || ctx_linearize(ctx) || parse_pkt(ctx, &p) != PARSE_OK)
		return CTX_ACT_OK;
	if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6) {
		struct icmp_err e;

		if (icmp_parse_error(ctx, &p, &e) == PARSE_OK &&
		    icmp_rev_dnat(ctx, &p, &e) < 0)
			return ns_verdict(ctx, &p, CTX_ACT_DROP, SL_HOOK_EGRESS);
		return CTX_ACT_OK;
	}
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return CTX_ACT_OK;
	if (ns_rev_dnat(ctx, &p, cfg, ct_now(cfg)) < 0)
		return ns_verdict(ctx, &p, CTX_ACT_DROP, SL_HOOK_EGRESS);
	return CTX_ACT_OK;
}
#endif /* SLUICE_TC */

#endif /* __SLUICE_NS_ENTRY_H */
