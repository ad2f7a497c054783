/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The reply paths of nodeport.h: a remote backend's reply to a nat port
 * (reverse SNAT and DNAT at once) and, with SLUICE_POD_LB, a pod's reply
 * to its own hairpin flow. */
#ifndef __SLUICE_NS_REPLY_H
#define __SLUICE_NS_REPLY_H

#include "ns_send.h"

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
	/* A flow past its lifetime (not collected yet) is gone, as for
	 * netfilter's conntrack: the forward path takes it as dead and
	 * starts a new flow (ct_is_new_syn), so translating its reply would
	 * revive half of it. */
	if (!e || e->lifetime < now)
		return NS_DROP(SL_DROP_NO_CT);
	/* A flow given another client port: the client's own. */
	if (e->flags & CT_F_SPORT)
		port = e->snat_port;
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	fe_port = e->nat_port;
	/* The route of the packet it becomes, kept in the ingress entry;
	 * asked before the flow's state is touched: a reply XDP cannot send
	 * is tc's, state and all (ns_xdp_defers). */
	fib = ns_fib_buf();
	if (!fib)
		return CTX_ACT_DROP;
	rc = ns_fib(ctx, p, &fe, fe_port, &client, port, e, now, fib);
	if (NS_XDP_DEFERS(ctx, rc, fib))
		return CTX_ACT_OK;
	ct_reply(ctx, cfg, p, e, ctx_len(ctx), now, &client, port);
	/* Not a SYN-ACK: a SYN flood's would fill the cache. */
	if ((rc == BPF_FIB_LKUP_RET_SUCCESS || rc == NS_FIB_KEPT) &&
	    !(p->tcp_flags & TCP_FLAG_SYN))
		fc_record(p, NAT_DIR_INGRESS, &fe, fe_port, &client, port, e, now);
	if (pkt_rewrite_nat(ctx, p, &client, port, &fe, fe_port))
		return CTX_ACT_DROP;
	return ns_send(ctx, p, FWD_ROUTE, fib, rc);
}

#endif /* SLUICE_POD_LB */

#ifdef SLUICE_POD_LB
/* ns_hairpin_how is how a hairpin flow's packet, from frontend fe, goes
 * back into its pod. */
static __always_inline int ns_hairpin_how(const union lb_addr *fe)
{
	return lb_is_node_addr(fe) ? FWD_LOCAL_DIRECT : FWD_LOCAL;
}

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
	/* The pod is the client too: its service entry is pod -> frontend. */
	ct_reply(ctx, cfg, p, e, ctx_len(ctx), now, &pod,
		 (e->flags & CT_F_SPORT) ? e->snat_port : p->dport);
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	if (pkt_rewrite(ctx, p, false, &fe, e->nat_port) ||
	    pkt_rewrite_addr(ctx, p, true, &pod))
		return CTX_ACT_DROP;
	return ns_forward(ctx, p, ns_hairpin_how(&fe), NULL, 0);
}
#endif /* SLUICE_POD_LB */

#endif /* __SLUICE_NS_REPLY_H */
