/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The north-south service path shared by tc_lb.c and xdp_lb.c.
 *
 *   ingress, to a frontend     service lookup (scope EXT) -> CT -> backend
 *                              local:  DNAT, deliver (redirect_peer / stack)
 *                              remote: DNAT + SNAT, FIB, redirect or XDP_TX
 *                                      or DSR: IPIP to the backend's node
 *   ingress, IPIP to the node  DSR on the backend node: decap, then as a
 *                              frontend, local backends only
 *   ingress, to node:nat port  reverse SNAT + reverse DNAT, FIB, redirect
 *   egress (tc only)           local backend's reply: reverse DNAT via CT
 *   ICMP errors about a flow    the quoted packet and the outer addresses,
 *                              in both of the reply paths above
 *
 * Anything else goes to the stack untouched.
 *
 * With SLUICE_POD_LB (tc_pod.c, --socket-lb=false) the same path serves
 * every frontend, ClusterIPs included, at LB_SCOPE_INT for traffic from
 * local pods, and never SNATs: the backend sees the pod's address, the
 * reply is reverse-DNATed on its way to the pod. No DSR, Maglev, source
 * ranges or reverse SNAT there.
 */
#ifndef __SLUICE_NODEPORT_H
#define __SLUICE_NODEPORT_H

#include <linux/if_ether.h>

#include "csum.h"
#include "lb.h"
#include "ct.h"
#include "nat.h"
#include "icmp.h"
#include "dsr.h"
#include "maglev.h"
#ifndef SLUICE_POD_LB
#include "flowcache.h"
#endif /* SLUICE_POD_LB */

#ifdef SLUICE_POD_LB
/* Pods reach every frontend, as through the socket LB. */
#define NS_SCOPE LB_SCOPE_INT
#define ns_svc_served(svc) true
#else
/* Frontends served here; a ClusterIP is for traffic from this node's pods. */
#define NS_SVC_FLAGS (SVC_F_NODEPORT | SVC_F_EXTERNAL_IP | SVC_F_LOADBALANCER)
#define NS_SCOPE LB_SCOPE_EXT
#define ns_svc_served(svc) ((svc)->flags & NS_SVC_FLAGS)
#endif /* SLUICE_POD_LB */

/* The CT flags that say how a flow is translated. */
#define NS_KIND_FLAGS (CT_F_LOCAL | CT_F_SNAT | CT_F_DSR | CT_F_HAIRPIN)

#define TTL_OFF      offsetof(struct iphdr, ttl)
#define HOPLIMIT_OFF offsetof(struct ipv6hdr, hop_limit)

static __always_inline __u32 ns_flow_hash(const struct ns_pkt *p)
{
	__u32 h = p->proto;
	int i;

#pragma unroll
	for (i = 0; i < 4; i++) {
		h = lb_hash64(((__u64)h << 32) | p->saddr.w[i]);
		h = lb_hash64(((__u64)h << 32) | p->daddr.w[i]);
	}
	return lb_hash64(((__u64)h << 32) | ((__u32)p->sport << 16) | p->dport);
}

#ifndef SLUICE_POD_LB
/* ns_maglev_backend_id returns the backend of the frontend's Maglev table
 * for a flow, so that a flow entering any node for the same frontend
 * reaches the same backend; 0 when the frontend has no table yet (the
 * caller then uses the slots). A function of its own: the hash's values
 * and spills stay out of the service path's frame, and the call adds one
 * small frame to the chain (32 bytes by 6.1's rule: ns_maps.h). */
static __noinline __u32 ns_maglev_backend_id(const struct ns_pkt *p, __u16 rev_nat_id)
{
	return lb_maglev_backend(rev_nat_id,
				 lb_maglev_flow_hash(&p->saddr, &p->daddr, p->sport,
						     p->dport, p->proto));
}

/* ns_src_range_allowed reports whether a new flow's client lies in one of
 * the frontend's loadBalancerSourceRanges. Not inlined, like
 * ns_maglev_backend_id: the key lives in this small frame, not in the
 * service path's. */
static __noinline bool ns_src_range_allowed(const struct ns_pkt *p, __u16 rev_nat_id)
{
	struct lb_src_range_key key __align_stack_8 = {
		.prefixlen  = LB_SRC_RANGE_STATIC_PREFIX + 128,
		.rev_nat_id = rev_nat_id,
	};

	__builtin_memcpy(key.addr, p->saddr.b, sizeof(key.addr));
	return bpf_map_lookup_elem(&lb_src_ranges, &key) != NULL;
}
#endif /* SLUICE_POD_LB */

/* The client identity for sessionAffinity: its address. Bit 63 keeps it
 * apart from the netns cookies the socket LB stores in lb_affinity. */
static __always_inline __u64 ns_client_id(const struct ns_pkt *p)
{
	return (1ULL << 63) | ((__u64)(p->saddr.w[0] ^ p->saddr.w[1] ^ p->saddr.w[2]) << 32) |
	       p->saddr.w[3];
}

/* ns_dec_ttl decrements the TTL / hop limit of a packet this program
 * forwards itself; it fails when the packet must not be forwarded. */
static __always_inline int ns_dec_ttl(struct __ctx_buff *ctx, const struct ns_pkt *p)
{
	__u8 ttl;

	if (p->v6) {
		if (ctx_load_bytes(ctx, p->l3_off + HOPLIMIT_OFF, &ttl, 1) || ttl <= 1)
			return -1;
		ttl--;
		return ctx_store_bytes(ctx, p->l3_off + HOPLIMIT_OFF, &ttl, 1);
	} else {
		__u8 word[2]; /* ttl, protocol: the checksummed 16-bit word */
		__u16 from, to;

		if (ctx_load_bytes(ctx, p->l3_off + TTL_OFF, word, 2) || word[0] <= 1)
			return -1;
		__builtin_memcpy(&from, word, 2);
		word[0]--;
		__builtin_memcpy(&to, word, 2);
		if (ctx_store_bytes(ctx, p->l3_off + TTL_OFF, word, 1))
			return -1;
		return ctx_l3_csum_replace(ctx, p->l3_off + offsetof(struct iphdr, check),
					   from, to, 2);
	}
}

enum {
	FWD_ROUTE, /* to another host: TTL decremented */
	FWD_LOCAL, /* to a pod on this node */
	FWD_ENCAP, /* in an outer header this node just made */
};

/* ns_fib_kept copies the FIB result kept in c into fib when it is from
 * this CT second and passed a packet at least as long (the MTU check). */
static __always_inline bool ns_fib_kept(const struct ct_fib *c, struct bpf_fib_lookup *fib,
					__u32 now)
{
	if (READ_ONCE(c->at) != now || !c->ifindex || fib->tot_len > c->max_len)
		return false;
	fib->ifindex = c->ifindex;
	__builtin_memcpy(fib->dmac, c->dmac, ETH_ALEN);
	__builtin_memcpy(fib->smac, c->smac, ETH_ALEN);
	return true;
}

/* ns_fib_keep keeps a successful FIB result in c for the rest of the CT
 * second. A packet of the flow on another CPU (a flow's packets normally
 * arrive on one) may read c meanwhile: at is cleared first and set last,
 * so one that starts reading after that looks up itself, and one already
 * reading may mix two FIB answers for this flow from this second. The
 * order is the compiler's and x86's (stores seen in program order); on a
 * weakly ordered CPU (arm64) such a reader may also see the previous
 * second's fields: BPF store-release needs LLVM 20 and 6.15, a later
 * change. */
static __always_inline void ns_fib_keep(struct ct_fib *c, const struct bpf_fib_lookup *fib,
					__u32 now)
{
	WRITE_ONCE(c->at, 0);
	barrier();
	c->ifindex = fib->ifindex;
	__builtin_memcpy(c->dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(c->smac, fib->smac, ETH_ALEN);
	c->max_len = fib->tot_len;
	barrier();
	WRITE_ONCE(c->at, now);
}

/* ns_fib's answer when it took the result kept in the CT entry: a success
 * without a lookup (no BPF_FIB_LKUP_RET_* value). */
#define NS_FIB_KEPT 0x100

/* ns_fib looks up the route of p from saddr:sport to daddr:dport (p's own
 * addresses, or those it is about to be given) into fib. A routed flow
 * passes its CT entry as keep (else NULL): the FIB result is kept there and
 * its later packets in the same CT second skip the lookup, so a route or
 * neighbour change reaches an established flow within a second. */
static __always_inline long ns_fib(struct __ctx_buff *ctx, const struct ns_pkt *p,
				   const union lb_addr *saddr, __be16 sport,
				   const union lb_addr *daddr, __be16 dport,
				   struct ct_entry *keep, __u32 now,
				   struct bpf_fib_lookup *fib)
{
	long rc;

	__builtin_memset(fib, 0, sizeof(*fib));
	fib->ifindex = ctx_ifindex(ctx);
	fib->l4_protocol = p->proto;
	fib->sport = sport;
	fib->dport = dport;
	fib->tot_len = ctx_len(ctx) - p->l3_off;
	if (keep && ns_fib_kept(&keep->fib, fib, now))
		return NS_FIB_KEPT;
	if (p->v6) {
		fib->family = AF_INET6;
		__builtin_memcpy(fib->ipv6_src, saddr->b, 16);
		__builtin_memcpy(fib->ipv6_dst, daddr->b, 16);
	} else {
		fib->family = AF_INET;
		fib->ipv4_src = saddr->w[3];
		fib->ipv4_dst = daddr->w[3];
	}
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (keep && rc == BPF_FIB_LKUP_RET_SUCCESS) {
		fib->tot_len = ctx_len(ctx) - p->l3_off; /* the lookup may reuse it */
		ns_fib_keep(&keep->fib, fib, now);
	}
	return rc;
}

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

/* ns_send sends a translated packet on its way (how: FWD_*) by the FIB's
 * answer (rc, fib). Whatever the FIB cannot resolve goes to the stack,
 * which routes, resolves neighbours and answers with ICMP errors. */
static __always_inline int ns_send(struct __ctx_buff *ctx, const struct ns_pkt *p,
				   int how, const struct bpf_fib_lookup *fib, long rc)
{
	bool local = how == FWD_LOCAL;
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
	long rc;

	if (!fib)
		return CTX_ACT_DROP;
	rc = ns_fib(ctx, p, &p->saddr, p->sport, &p->daddr, p->dport, keep, now, fib);
	return ns_send(ctx, p, how, fib, rc);
}

/* ns_rev_dnat restores the frontend as the source of a reply from a
 * backend (p: backend -> client). It returns 1 when p belongs to a tracked
 * flow, 0 when not, < 0 on error. */
static __always_inline int ns_rev_dnat(struct __ctx_buff *ctx, struct ns_pkt *p,
				       const struct ns_config *cfg, __u32 now)
{
	struct ct_tuple t __align_stack_8;
	union lb_addr fe __align_stack_8;
	struct ct_entry *e;
	__be16 port;

	/* Egress: a local backend's every reply, and this frame has room: the
	 * key on the stack saves the scratch lookup (a helper call before 6.10). */
	e = ct_lookup_reply(p, &t);
	if (!e)
		return 0;
	ct_update(e, cfg, p, ctx_len(ctx), now, true);
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	port = e->nat_port;
	if (pkt_rewrite(ctx, p, false, &fe, port))
		return -1;
	return 1;
}

/* ns_remote_kind is how a new flow reaches a remote backend, by --lb-mode.
 * DSR needs the backend's node in ns_tunnel; without it, SNAT. */
static __always_inline __u16 ns_remote_kind(const struct ns_config *cfg, __u8 proto,
					    const union lb_addr *backend)
{
	union lb_addr node __align_stack_8;

	if (cfg->mode == NS_MODE_SNAT ||
	    (cfg->mode == NS_MODE_HYBRID && proto != IPPROTO_TCP))
		return CT_F_SNAT;
	return dsr_tunnel_endpoint(backend, &node) ? CT_F_DSR : CT_F_SNAT;
}

/* ns_dsr_forward sends p (client -> frontend, untouched) to the node of
 * backend in an outer header from this node. */
static __always_inline int ns_dsr_forward(struct __ctx_buff *ctx, struct ns_pkt *p,
					  const struct ns_config *cfg,
					  const union lb_addr *backend)
{
	union lb_addr node __align_stack_8;
	union lb_addr src __align_stack_8;
	__u32 mtu = dsr_mtu(ctx, p);

	if (mtu)
		return dsr_reply_too_big(ctx, p, mtu);
	if (!dsr_tunnel_endpoint(backend, &node) ||
	    snat_source(cfg, p->v6, &p->daddr, &src) ||
	    dsr_encap(ctx, p, &src, &node))
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, FWD_ENCAP, NULL, 0);
}

#ifndef SLUICE_POD_LB
/* nodeport_rev_snat handles a reply from a remote backend to a nat port
 * (p: backend -> node IP:nat port): the snat mapping gives the client, the
 * flow's ingress entry the frontend, and both sides are rewritten at once.
 * It returns -1 when p is no such reply. */
static __always_inline int nodeport_rev_snat(struct __ctx_buff *ctx, struct ns_pkt *p,
					     const struct ns_config *cfg, __u32 now)
{
	union lb_addr client __align_stack_8;
	union lb_addr fe __align_stack_8;
	const struct nat_entry *n;
	struct bpf_fib_lookup *fib;
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *e;
	__be16 port, fe_port;
	long rc;

	if (!s)
		return CTX_ACT_DROP;
	n = snat_lookup_reply(p, &s->tuple);
	if (!n)
		return -1;
	__builtin_memcpy(client.b, n->to_addr, sizeof(client.b));
	port = n->to_port;
	e = ct_lookup_reply_to(p, &client, port, &s->tuple);
	if (!e)
		return CTX_ACT_DROP;
	ct_update(e, cfg, p, ctx_len(ctx), now, true);
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	fe_port = e->nat_port;
	/* The route of the packet it becomes, kept in the ingress entry. */
	fib = ns_fib_buf();
	if (!fib)
		return CTX_ACT_DROP;
	rc = ns_fib(ctx, p, &fe, fe_port, &client, port, e, now, fib);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == NS_FIB_KEPT)
		fc_record(p, NAT_DIR_INGRESS, &fe, fe_port, &client, port, e, now);
	if (pkt_rewrite_nat(ctx, p, &client, port, &fe, fe_port))
		return CTX_ACT_DROP;
	return ns_send(ctx, p, FWD_ROUTE, fib, rc);
}

/* ns_cached sends p (before translation, len bytes) as the flow cache's
 * entry f for it says: both sides rewritten, the TTL decremented, out with the MACs of
 * the FIB result its flow kept this CT second. */
static __always_inline int ns_cached(struct __ctx_buff *ctx, struct ns_pkt *p,
				     struct ns_flow *f, __u32 len)
{
	if (pkt_rewrite_nat(ctx, p, (const union lb_addr *)f->daddr, f->dport,
			    (const union lb_addr *)f->saddr, f->sport))
		return CTX_ACT_DROP;
	f->packets++;
	f->bytes += len;
	if (ns_dec_ttl(ctx, p))
		return CTX_ACT_OK;
	return ns_xmit(ctx, f->fib.ifindex, f->fib.dmac, f->fib.smac);
}
#endif /* SLUICE_POD_LB */

/* ns_flow_alive: the frontend and the backend a CT service entry names are
 * still installed. A deleted frontend loses its rev nat entry (the
 * reconciler deletes it after the master), a deleted backend its
 * lb_backends entry; an ID reused since names another address. Two small
 * lookups instead of the service master, its wildcard and a slot. */
static __always_inline bool ns_flow_alive(const struct ct_entry *e, const struct ns_pkt *p)
{
	const struct lb_rev_nat *rn;
	const struct lb_backend *be;
	__u32 backend_id = e->backend_id;
	__u16 rev_nat_id = e->rev_nat_id;
	union lb_addr any __align_stack_8;

	rn = bpf_map_lookup_elem(&lb_rev_nat, &rev_nat_id);
	if (!rn || rn->port != p->dport)
		return false;
	if (!addr_equal(&p->daddr, rn->addr)) {
		any = p->daddr;
		addr_to_wildcard(&any);
		if (!addr_equal(&any, rn->addr))
			return false;
	}
	be = bpf_map_lookup_elem(&lb_backends, &backend_id);
	return be && be->port == e->nat_port && addr_equal((const union lb_addr *)e->nat_addr, be->addr);
}

/* ns_established looks up the CT service entry of p and returns it when it
 * still decides the flow: alive, not a SYN reusing a closing tuple, and, for
 * SNAT, with its nat port: copied into the entry (snat_port), or else its
 * egress mapping in *n. Then the entry holds all that the translation
 * needs, and no service, slot or backend entry is read. Whether the flow is
 * alive is checked by the first packet in each CT second (alive_at): a
 * deleted backend or frontend stops taking an established flow's packets
 * within a second, as the agent's own updates land; kube-proxy leaves an
 * established TCP flow to a deleted endpoint alone until conntrack ends it. */
static __always_inline struct ct_entry *ns_established(const struct ns_pkt *p, __u32 now,
							const struct nat_entry **n)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_tuple *t;
	struct ct_entry *e;

	/* The key in the scratch, not the stack: precisely tracked stack
	 * slots cost the verifier ~20% more states on this path. */
	if (!s)
		return NULL;
	t = &s->tuple;
	ct_tuple_set(t, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	e = bpf_map_lookup_elem(&ct, t);
	if (!e || ct_is_new_syn(e, p->proto, p->tcp_flags, now))
		return NULL;
	if (READ_ONCE(e->alive_at) != now) {
		if (!ns_flow_alive(e, p))
			return NULL;
		WRITE_ONCE(e->alive_at, now);
	}
	*n = NULL;
	if ((e->flags & (CT_F_LOCAL | CT_F_DSR)) || e->snat_port)
		return e;
	/* The egress mapping's key is the tuple after DNAT. */
	__builtin_memcpy(t->daddr, e->nat_addr, sizeof(t->daddr));
	t->dport = e->nat_port;
	t->dir = NAT_DIR_EGRESS;
	*n = bpf_map_lookup_elem(&snat, t);
	return *n ? e : NULL;
}

#ifdef SLUICE_POD_LB
/* ns_hairpin_reply handles a pod's reply to a hairpin flow (pod:backend
 * port -> frontend:client port): it becomes frontend:port -> pod:client
 * port and goes back into the pod. It returns -1 when p is no such reply. */
static __always_inline int ns_hairpin_reply(struct __ctx_buff *ctx, struct ns_pkt *p,
					    const struct ns_config *cfg, __u32 now)
{
	union lb_addr fe __align_stack_8;
	union lb_addr pod = p->saddr;
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *e;

	if (!s)
		return CTX_ACT_DROP;
	e = ct_lookup_reply(p, &s->tuple);
	if (!e || !(e->flags & CT_F_HAIRPIN))
		return -1;
	ct_update(e, cfg, p, ctx_len(ctx), now, true);
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	if (pkt_rewrite(ctx, p, false, &fe, e->nat_port) ||
	    pkt_rewrite_addr(ctx, p, true, &pod))
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, FWD_LOCAL, NULL, 0);
}
#endif /* SLUICE_POD_LB */

/* nodeport_lb load-balances a packet to a frontend served here. tunnel is
 * NULL, or on a DSR backend node the LB node that sent the packet: then
 * only local backends are used, and a frontend equal to tunnel is a
 * NodePort of that node.
 *
 * An established flow takes the fast path: one CT lookup (and the snat
 * one) gives the backend, how to reach it and the source to use. */
static __always_inline int nodeport_lb(struct __ctx_buff *ctx, struct ns_pkt *p,
				       const struct ns_config *cfg,
				       const union lb_addr *tunnel)
{
	struct lb_svc_key key __align_stack_8;
	union lb_addr frontend __align_stack_8;
	union lb_addr be_addr __align_stack_8;
	const struct nat_entry *n = NULL;
	const struct lb_backend *be = NULL;
	const struct lb_svc_val *svc;
	struct ct_scratch *s;
	__u32 now = ct_now(cfg), len = ctx_len(ctx), hash = 0, backend_id = 0;
	__u16 rev_nat_id, kind = 0;
	struct ct_entry *e;
	__be16 be_port;
	int ret;

	if (!tunnel) {
#ifndef SLUICE_POD_LB
		struct ns_flow *f = fc_lookup(p, fc_hash(p), now, len - p->l3_off);

		if (f)
			return ns_cached(ctx, p, f, len);
#endif /* SLUICE_POD_LB */
		e = ns_established(p, now, &n);
		if (e) {
			/* Once a CT second: the ingress entry and the SNAT
			 * mapping kept with it. */
			if (ct_update(e, cfg, p, len, now, false) && (s = ns_scratch())) {
				ct_restore_ingress(p, e, s);
				snat_refresh(cfg, e, p, s);
			}
			kind = e->flags & NS_KIND_FLAGS;
			__builtin_memcpy(be_addr.b, e->nat_addr, sizeof(be_addr.b));
			be_port = e->nat_port;
			goto translate;
		}
#ifdef SLUICE_POD_LB
		ret = ns_hairpin_reply(ctx, p, cfg, now);
		if (ret >= 0)
			return ret;
#else
		/* A reply to a nat port: it has no service entry, as nat
		 * ports lie outside the NodePort range. */
		if (lb_is_node_addr(&p->daddr)) {
			ret = nodeport_rev_snat(ctx, p, cfg, now);
			if (ret >= 0)
				return ret;
		}
#endif /* SLUICE_POD_LB */
	}

	lb_key_init(&key, &p->daddr, p->dport, p->proto);
	svc = lb_lookup_service(&key, NS_SCOPE);
	if (!svc && tunnel && addr_equal(&p->daddr, tunnel->b)) {
		frontend = p->daddr;
		addr_to_wildcard(&frontend);
		lb_key_init(&key, &frontend, p->dport, p->proto);
		svc = lb_lookup_service(&key, LB_SCOPE_EXT);
	}
	if (!svc || !ns_svc_served(svc))
		return tunnel ? CTX_ACT_DROP : CTX_ACT_OK;
	rev_nat_id = svc->rev_nat_id;
	hash = ns_flow_hash(p);

	/* On the backend node, and for flows whose entry the fast path did
	 * not take (a stale backend, a missing snat mapping). */
	s = ns_scratch();
	if (!s)
		return CTX_ACT_DROP;
	ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	e = bpf_map_lookup_elem(&ct, &s->tuple);
	if (e && !ct_is_new_syn(e, p->proto, p->tcp_flags, now)) {
		backend_id = e->backend_id;
		kind = e->flags & NS_KIND_FLAGS;
		be = bpf_map_lookup_elem(&lb_backends, &backend_id);
		if (be && ct_update(e, cfg, p, len, now, false))
			ct_restore_ingress(p, e, s);
	}
	if (!be) {
		/* No backend: drop, as kube-proxy's REJECT stops the flow. */
		if (svc->count == 0)
			return CTX_ACT_DROP;
#ifndef SLUICE_POD_LB
		/* A new flow only: an established one passed this check when
		 * it was created. */
		if ((svc->flags & SVC_F_SRC_RANGES) && !ns_src_range_allowed(p, rev_nat_id))
			return CTX_ACT_DROP;
		if (tunnel)
			be = dsr_select_local(&key, svc, hash, &backend_id);
		else if ((svc->flags & (SVC_F_MAGLEV | SVC_F_AFFINITY)) == SVC_F_MAGLEV &&
			 (backend_id = ns_maglev_backend_id(p, rev_nat_id)))
			be = bpf_map_lookup_elem(&lb_backends, &backend_id);
#endif /* SLUICE_POD_LB */
		if (!be && !tunnel)
			be = lb_select_backend_id(&key, svc, hash, ns_client_id(p), &backend_id);
		if (!be)
			return CTX_ACT_DROP;
		__builtin_memcpy(be_addr.b, be->addr, sizeof(be_addr.b));
		be_port = be->port;
#ifdef SLUICE_POD_LB
		/* Never SNAT: DNAT only, redirect_peer to a local pod and the
		 * stack to anything else, replies reverse-DNATed via CT. But a
		 * pod that reaches itself would get a packet from its own
		 * address, which it drops: hairpin flows come from the
		 * frontend instead. */
		kind = CT_F_LOCAL;
		if (addr_equal(&p->saddr, be_addr.b))
			kind |= CT_F_HAIRPIN;
#else
		if (tunnel)
			kind = CT_F_LOCAL | CT_F_DSR;
		else if (be->flags & BE_F_LOCAL)
			kind = CT_F_LOCAL;
		else
			kind = ns_remote_kind(cfg, p->proto, &be_addr);
#endif /* SLUICE_POD_LB */
		/* No NAT46/64 here: a backend of the other family is a config error. */
		if (addr_is_v4(&be_addr) == p->v6)
			return CTX_ACT_DROP;
		if (ct_create_flow(cfg, p, len, now, &be_addr, be_port, backend_id,
				   rev_nat_id, kind))
			return CTX_ACT_DROP;
		e = NULL; /* replaced: the new entry learns its nat port later */
	} else {
		__builtin_memcpy(be_addr.b, be->addr, sizeof(be_addr.b));
		be_port = be->port;
	}

translate:
	if (addr_is_v4(&be_addr) == p->v6)
		return CTX_ACT_DROP;
	if ((kind & (CT_F_DSR | CT_F_LOCAL)) == CT_F_DSR)
		return ns_dsr_forward(ctx, p, cfg, &be_addr);
	frontend = p->daddr;
	if (!(kind & CT_F_LOCAL) && (n || (e && e->snat_port))) {
		/* An established SNAT flow (e: its service entry): its
		 * mapping, or the entry's copy of it; both sides at once. */
		union lb_addr node __align_stack_8;
		struct bpf_fib_lookup *fib = ns_fib_buf();
		__be16 port;
		long rc;

		if (!fib)
			return CTX_ACT_DROP;
		if (n) {
			__builtin_memcpy(node.b, n->to_addr, sizeof(node.b));
			port = n->to_port;
			/* Later packets of the flow take the copy. */
			if (e)
				snat_cache(cfg, e, p->v6, &frontend, n);
		} else {
			port = e->snat_port;
			node = *snat_copy_source(cfg, e, p->v6, &frontend);
		}
		/* The route of the packet it becomes, asked before it becomes
		 * it: one too big for the way to the backend is answered to
		 * the client (fragmentation needed, packet too big) from the
		 * frontend. Translated first, it would go to the stack, whose
		 * error would be addressed to this node's nat port. */
		rc = ns_fib(ctx, p, &node, port, &be_addr, be_port, e, now, fib);
		if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
			return dsr_reply_too_big(ctx, p, fib->mtu_result);
#ifndef SLUICE_POD_LB
		/* The flow's later packets in this CT second take the cache. */
		if (e && (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == NS_FIB_KEPT))
			fc_record(p, CT_DIR_SERVICE, &node, port, &be_addr, be_port, e, now);
#endif /* SLUICE_POD_LB */
		if (pkt_rewrite_nat(ctx, p, &be_addr, be_port, &node, port))
			return CTX_ACT_DROP;
		return ns_send(ctx, p, FWD_ROUTE, fib, rc);
	}
	if (pkt_rewrite(ctx, p, true, &be_addr, be_port))
		return CTX_ACT_DROP;
#ifdef SLUICE_POD_LB
	if ((kind & CT_F_HAIRPIN) && pkt_rewrite_addr(ctx, p, false, &frontend))
		return CTX_ACT_DROP;
#endif /* SLUICE_POD_LB */
	if (kind & CT_F_LOCAL)
		return ns_forward(ctx, p, FWD_LOCAL, NULL, 0);
	if (snat_egress(ctx, p, cfg, &frontend, hash, now))
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, FWD_ROUTE, e, now);
}

/* nodeport_dsr_backend handles a DSR packet from an LB node. */
static __always_inline int nodeport_dsr_backend(struct __ctx_buff *ctx, struct ns_pkt *p,
						const struct ns_config *cfg)
{
	union lb_addr lb_node __align_stack_8;

	if (dsr_decap(ctx, p, &lb_node) != PARSE_OK)
		return CTX_ACT_DROP;
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return CTX_ACT_DROP;
	return nodeport_lb(ctx, p, cfg, &lb_node);
}

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
	if (ret < 0)
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, local ? FWD_LOCAL : FWD_ROUTE, NULL, 0);
}

/* nodeport_ingress runs on every packet entering an external device. */
static __always_inline int nodeport_ingress(struct __ctx_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();
	struct ns_pkt p;

	if (!cfg || ctx_linearize(ctx))
		return CTX_ACT_OK;
	switch (parse_pkt(ctx, &p)) {
	case PARSE_OK:
		break;
	case PARSE_DROP:
		return CTX_ACT_DROP;
	default:
		return CTX_ACT_OK;
	}
#ifndef SLUICE_POD_LB
	if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6)
		return nodeport_icmp_ingress(ctx, &p);
	if (dsr_is_tunnel(&p))
		return dsr_from_node(&p) ? nodeport_dsr_backend(ctx, &p, cfg) : CTX_ACT_OK;
#endif /* SLUICE_POD_LB */
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return CTX_ACT_OK;
	return nodeport_lb(ctx, &p, cfg, NULL);
}

#ifdef SLUICE_TC
/* nodeport_egress runs on every packet leaving an external device: a local
 * backend's reply, or its ICMP error, gets its frontend back. */
static __always_inline int nodeport_egress(struct __ctx_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();
	struct ns_pkt p;

	if (!cfg || ctx_linearize(ctx) || parse_pkt(ctx, &p) != PARSE_OK)
		return CTX_ACT_OK;
	if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6) {
		struct icmp_err e;

		if (icmp_parse_error(ctx, &p, &e) == PARSE_OK &&
		    icmp_rev_dnat(ctx, &p, &e) < 0)
			return CTX_ACT_DROP;
		return CTX_ACT_OK;
	}
	if (p.proto != IPPROTO_TCP && p.proto != IPPROTO_UDP)
		return CTX_ACT_OK;
	if (ns_rev_dnat(ctx, &p, cfg, ct_now(cfg)) < 0)
		return CTX_ACT_DROP;
	return CTX_ACT_OK;
}
#endif /* SLUICE_TC */

#endif /* __SLUICE_NODEPORT_H */
