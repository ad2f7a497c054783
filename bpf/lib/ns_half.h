/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A half-open TCP flow's part of the service path (nodeport.h). A SYN makes
 * only the half its SYN-ACK needs (ct.h); the client's ACK that
 * acknowledges the SYN-ACK completes the flow (ns_complete), and a packet
 * of it that does not complete it goes on translated, with no state made
 * (ns_half_forward). */
#ifndef __SLUICE_NS_HALF_H
#define __SLUICE_NS_HALF_H

#include "nat.h"
#include "ns_send.h"

#ifndef SLUICE_POD_LB
/* ns_complete completes p's half-open flow to be_addr:be_port when p is
 * its handshake's ACK (ct_complete: 1, or 3 when another CPU just did, its
 * service entry's key in the scratch's tuple; 0 when it has none; -1 when
 * p is not that ACK; 2 when p goes on with no state made, for
 * ns_half_forward: the client's RST, or a packet of a flow another CPU is
 * completing). */
static __always_inline int ns_complete(struct __ctx_buff *ctx, const struct ns_pkt *p,
				       const union lb_addr *be_addr, __be16 be_port, __u32 len)
{
	struct ct_scratch *s = ns_scratch();
	int ret;

	if (!s || ctx_load_bytes(ctx, p->l4_off + 8, &s->ack_seq, sizeof(s->ack_seq)))
		return 0;
	s->ack_seq = bpf_ntohl(s->ack_seq);
	ct_tuple_set(&s->tuple2, &p->saddr, be_addr, p->sport, be_port, p->proto, CT_DIR_INGRESS);
	ret = ct_complete(p);
	return ret == 1 ? ct_complete_svc(p, len) : ret;
}

/* ns_half_forward sends the client's packet p of a half-open flow on to its
 * backend (ct_complete: the backend in the scratch's half_key, and where a
 * masqueraded flow leaves from in its nat: 0 port for a local backend),
 * translated as the flow's packets are, with no state made or kept: the
 * client's RST, or a packet whose flow another CPU is completing. A global
 * function, verified once: both are rare. */
__noinline int ns_half_forward(struct __ctx_buff *ctx, struct ns_pkt *p)
{
	struct ct_scratch *s = ns_scratch();

	if (!s || !p)
		return CTX_ACT_DROP;
	if (!s->nat.to_port) {
		if (pkt_rewrite(ctx, p, true, (const union lb_addr *)s->half_key.daddr, s->half_key.dport))
			return CTX_ACT_DROP;
		return ns_forward(ctx, p, FWD_LOCAL, NULL, 0);
	}
#ifdef SLUICE_XDP
	{
		/* Inline, not ns_xdp_route: this frame and its on the stack
		 * at once would pass 512 bytes. */
		struct bpf_fib_lookup *fib = ns_fib_buf();
		long rc;

		if (!fib)
			return CTX_ACT_DROP;
		rc = ns_fib(ctx, p, &p->daddr, p->sport, (const union lb_addr *)s->half_key.daddr,
			    s->half_key.dport, NULL, 0, fib);
		if (ns_xdp_defers(ctx, rc, fib))
			return CTX_ACT_OK; /* tc's */
		if (pkt_rewrite_nat(ctx, p, (const union lb_addr *)s->half_key.daddr,
				    s->half_key.dport, (const union lb_addr *)s->nat.to_addr,
				    s->nat.to_port))
			return CTX_ACT_DROP;
		return ns_send(ctx, p, FWD_ROUTE, fib, rc);
	}
#else
	if (pkt_rewrite_nat(ctx, p, (const union lb_addr *)s->half_key.daddr, s->half_key.dport,
			    (const union lb_addr *)s->nat.to_addr, s->nat.to_port))
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, FWD_ROUTE, NULL, 0);
#endif /* SLUICE_XDP */
}
#endif /* SLUICE_POD_LB */

#endif /* __SLUICE_NS_HALF_H */
