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
 * Anything else goes to the stack untouched. ICMP errors and the DSR
 * backend node's tunnel run as tail-call stages of their own (Stages,
 * below), verified from their own entries.
 *
 * With SLUICE_POD_LB (tc_pod.c, --socket-lb=false) the same path serves
 * every frontend, ClusterIPs included, at LB_SCOPE_INT for traffic from
 * local pods, and never SNATs: the backend sees the pod's address, the
 * reply is reverse-DNATed on its way to the pod. No DSR, Maglev, source
 * ranges or reverse SNAT there.
 *
 * The parts: selection in lb.h (the frontend, a new flow's backend, the CT
 * entry of an established one), translation in nat.h and csum.h, routing
 * and the MTU in fib.h, sending in ns_send.h, the reply paths in
 * ns_reply.h, DSR in dsr.h, ICMP errors in icmp.h, XDP's route question
 * in ns_xdp.h, the half-open flow's completion in ns_half.h; this file is
 * the service path (nodeport_lb), and ns_entry.h the programs' entry
 * points, which tie the paths together.
 */
#ifndef __SLUICE_NODEPORT_H
#define __SLUICE_NODEPORT_H

#include <linux/if_ether.h>

/* North-south serves NodePorts on this node's addresses only (maps.h);
 * the per-packet pod LB, east-west, on any node's. */
#ifndef SLUICE_POD_LB
#define LB_NODEPORT_NODES LB_NODE_IP_LOCAL
#endif /* SLUICE_POD_LB */

#include "csum.h"
#include "lb.h"
#include "ct.h"
#include "nat.h"
#include "fib.h"
#include "icmp.h"
#include "dsr.h"
#include "nfct.h"
#ifndef SLUICE_POD_LB
#include "flowcache.h"
#endif /* SLUICE_POD_LB */

#include "ns_send.h"
#include "ns_reply.h"
#include "ns_xdp.h"
#include "ns_half.h"

/* The deepest header byte each path reads, from the frame's start: at tc
 * nothing past ctx.h's CTX_PULL_LEN is sure to be in the linear part, and
 * a read there would fail at tc where XDP (the whole frame) succeeds. A
 * change that reads deeper fails to compile here until CTX_PULL_LEN, which
 * costs a pull of that much on entry, grows with it.
 *   ICMPv4 error: IPv4 with options, the error's header, the quoted IPv4
 *     with options and the quoted TCP checksum (icmp_parse_error);
 *   ICMPv6 error: the same with IPv6 headers (a quote's extension headers
 *     are not parsed);
 *   TCP or UDP: IPv4 with options, or IPv6 with a fragment or jumbo
 *     header, then ports and TCP's flags (parse_l4);
 *   DSR tunnel: the outer IPv4 header with options, or IPv6 and sluice's
 *     destination options (parse_ipv6 takes no other length); the inner
 *     packet is read after the outer header is popped, as a TCP/UDP one. */
#define NS_IP4_MAX_HLEN 60
#define NS_L4_READ (TCP_FLAGS_OFF + 1)
#define NS_QUOTE_L4_READ (offsetof(struct tcphdr, check) + sizeof(__sum16))
#define NS_READ_ICMP4 (ETH_HLEN + NS_IP4_MAX_HLEN + ICMP_ERR_HLEN + NS_IP4_MAX_HLEN + NS_QUOTE_L4_READ)
#define NS_READ_ICMP6 (ETH_HLEN + 2 * sizeof(struct ipv6hdr) + ICMP_ERR_HLEN + NS_QUOTE_L4_READ)
#define NS_READ_L4_4 (ETH_HLEN + NS_IP4_MAX_HLEN + NS_L4_READ)
#define NS_READ_L4_6 (ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct ipv6_jumbo) + NS_L4_READ)
#define NS_READ_DSR4 (ETH_HLEN + NS_IP4_MAX_HLEN)
#define NS_READ_DSR6 (ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct dsr_opt6))
#define NS_READ_GUE4 (ETH_HLEN + NS_IP4_MAX_HLEN + sizeof(struct udphdr) + DSR_GUE4_LEN)
#define NS_READ_GUE6 (ETH_HLEN + sizeof(struct ipv6hdr) + sizeof(struct udphdr) + DSR_GUE6_LEN)
_Static_assert(sizeof(struct ipv6_frag) <= sizeof(struct ipv6_jumbo), "IPv6's deepest L4 read");
_Static_assert(sizeof(struct dsr_opt6) == NS_DSR_OPT6_LEN, "parse_ipv6's DSR header length");
#ifdef SLUICE_TC
_Static_assert(CTX_PULL_LEN >= NS_READ_ICMP4 && CTX_PULL_LEN >= NS_READ_ICMP6 &&
	       CTX_PULL_LEN >= NS_READ_L4_4 && CTX_PULL_LEN >= NS_READ_L4_6 &&
	       CTX_PULL_LEN >= NS_READ_DSR4 && CTX_PULL_LEN >= NS_READ_DSR6 &&
	       CTX_PULL_LEN >= NS_READ_GUE4 && CTX_PULL_LEN >= NS_READ_GUE6,
	       "CTX_PULL_LEN (ctx.h) must cover the deepest header read");
#endif /* SLUICE_TC */


/* ns_rewrite_sport gives a flow whose tuple after DNAT another flow holds
 * (CT_F_SPORT, ct.h) the client port its backend sees (before a masqueraded
 * one's SNAT, whose mapping is keyed by it): from its
 * service entry e, or for the flow this packet created, the scratch. */
static __always_inline int ns_rewrite_sport(struct __ctx_buff *ctx, struct ns_pkt *p,
					    const struct ct_entry *e, bool created)
{
	struct ct_scratch *s;

	if (e)
		return (e->flags & CT_F_SPORT) ? pkt_rewrite_port(ctx, p, false, e->snat_port) : 0;
	if (!created || !(s = ns_scratch()) || !s->sport)
		return 0;
	return pkt_rewrite_port(ctx, p, false, s->sport);
}

/* nodeport_lb load-balances a packet to a frontend served here. tunnel is
 * NULL, or on a DSR backend node what the LB node that sent the packet
 * said: then only local backends are used, and a frontend of no service
 * here is a NodePort of that node (one of its addresses, which this node
 * need not know: the tunnel's source is a node, dsr_from_node).
 *
 * An established flow takes the fast path: one CT lookup (and the snat
 * one) gives the backend, how to reach it and the source to use. */
static __always_inline int nodeport_lb(struct __ctx_buff *ctx, struct ns_pkt *p,
				       const struct ns_config *cfg,
				       const struct dsr_info *tunnel)
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
	bool created = false, half;
	int ret;

	if (!tunnel) {
#ifndef SLUICE_POD_LB
		/* A later fragment has no L4 header for the cache's rewrite. */
		struct ns_flow *f = ns_has_l4(p) ? fc_lookup(p, fc_hash(p), now, ns_mtu_len(ctx, p)) : NULL;

		if (f)
			return ns_cached(ctx, p, f, len);
#endif /* SLUICE_POD_LB */
		e = ns_established(p, now, &n);
#ifdef SLUICE_XDP
		if (e && ns_xdp_established_defers(ctx, p, e))
			return CTX_ACT_OK;
#endif /* SLUICE_XDP */
		if (e) {
			/* Once a CT second: the ingress entry and the SNAT
			 * mapping kept with it. */
			if (ct_update(e, cfg, p, len, now, false) && (s = ns_scratch())) {
				ct_restore_ingress(cfg, p, e, now);
				snat_refresh(cfg, e, p, s, now);
			}
			/* A new flow that this packet established moves to
			 * the established flows' tables. */
			if (ct_promote_if_ready(ctx, p, &e, now))
				n = NULL; /* moved: n may be freed, and reused */
			kind = e->flags & NS_KIND_FLAGS;
			rev_nat_id = e->rev_nat_id;
			backend_id = e->backend_id;
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
		if (snat_is_nat_port(cfg, p->dport) && lb_is_node_addr(&p->daddr)) {
			ret = nodeport_rev_snat(ctx, p, cfg, now);
			if (ret >= 0)
				return ret;
		}
#endif /* SLUICE_POD_LB */
	}

#ifndef SLUICE_POD_LB
	/* Before any lookup: no state, no translation for these. */
	if (ns_martian(p))
		return NS_DROP(SL_DROP_MARTIAN);
#endif /* SLUICE_POD_LB */
	lb_key_init(&key, &p->daddr, p->dport, p->proto);
	svc = lb_lookup_service(&key, NS_SCOPE);
	if (!svc && tunnel) {
		frontend = p->daddr;
		addr_to_wildcard(&frontend);
		lb_key_init(&key, &frontend, p->dport, p->proto);
		svc = lb_lookup_service(&key, LB_SCOPE_EXT);
	}
	if (!svc || !ns_svc_served(svc))
		return tunnel ? NS_DROP(SL_DROP_DSR_NO_SERVICE) : CTX_ACT_OK;
#ifdef SLUICE_POD_LB
	if (lb_remote_local_nodeport(&p->daddr, &key))
		return CTX_ACT_OK; /* that node's to answer, as from the socket LB */
#endif
	rev_nat_id = svc->rev_nat_id;
	hash = ns_flow_hash(p);

	/* On the backend node, and for flows whose entry the fast path did
	 * not take (a stale backend, a missing snat mapping). */
	s = ns_scratch();
	if (!s)
		return CTX_ACT_DROP;
	ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	/* A new flow's first packet: ns_established found nothing. */
	e = !tunnel && s->ct_absent ? NULL : ct_lookup(&s->tuple);
	/* On the backend node only a local delivery: an entry of this node
	 * as the LB node (the same tuple, sent here by a client) would send
	 * the packet back into a tunnel. That flow is stale (the client's
	 * packets come tunnelled now: an ECMP change) and goes: left in the
	 * established table, which ct_lookup reads first, it would hide the
	 * tunnelled flow made below in ct_new, which would then be made anew
	 * for every packet and never promoted. */
	if (e && tunnel && !(e->flags & CT_F_LOCAL)) {
		if (!(e->flags & CT_F_NEW))
			ct_delete_flow(p, e);
		e = NULL;
	}
	if (e && !ct_is_new_syn(e, p->proto, p->tcp_flags, now)) {
		backend_id = e->backend_id;
		kind = e->flags & NS_KIND_FLAGS;
		be = bpf_map_lookup_elem(&lb_backends, &backend_id);
		/* A backend ID given to another address since (after an agent
		 * restart) names another backend: the flow's is gone. */
		if (be && (be->port != e->nat_port ||
			   !addr_equal((const union lb_addr *)e->nat_addr, be->addr)))
			be = NULL;
#ifdef SLUICE_XDP
		if (!tunnel && ns_xdp_established_defers(ctx, p, e))
			return CTX_ACT_OK;
#endif /* SLUICE_XDP */
		/* An established TCP flow whose backend left keeps it (the
		 * tunnel's flows on a DSR backend node come here): all it
		 * needs is in its entry, as on the fast path. */
		if (!be && ns_flow_kept(e, p->proto)) {
			if (ct_update(e, cfg, p, len, now, false))
				ct_restore_ingress(cfg, p, e, now);
			__builtin_memcpy(be_addr.b, e->nat_addr, sizeof(be_addr.b));
			be_port = e->nat_port;
			goto translate;
		}
		if (be && ct_update(e, cfg, p, len, now, false))
			ct_restore_ingress(cfg, p, e, now);
		if (be)
			ct_promote_if_ready(ctx, p, &e, now);
	}
	/* An earlier flow's entry in the established table (dead, a SYN
	 * reusing a closing tuple, its backend gone) gives way to the new flow
	 * made below: found first, it would hide it. */
	if (!be && e && !(e->flags & CT_F_NEW))
		ct_delete_flow(p, e);
	/* One in ct_new (a closed flow retired there, ct_retire) goes too:
	 * a SYN's half-open flow writes no service entry over it, and the
	 * client's ACK would find the old flow's. */
	else if (!be && e) {
		ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
			     CT_DIR_SERVICE);
		bpf_map_delete_elem(&ct_new, &s->tuple);
	}
	if (!be) {
		bool syn = false;

		/* No backend. A traffic policy Local without a local one:
		 * dropped, as kube-proxy drops. None at all: port
		 * unreachable, as kube-proxy's REJECT answers, so that the
		 * client fails at once instead of retrying its SYN. */
		if (svc->count == 0) {
			if (tunnel || (svc->flags & (SVC_F_ETP_LOCAL | SVC_F_ITP_LOCAL)))
				return NS_DROP(tunnel ? SL_DROP_DSR_NO_SERVICE : SL_DROP_NO_LOCAL_BACKEND);
			return ns_reply_icmp(ctx, p, 0, SL_DROP_NO_BACKEND);
		}
#ifndef SLUICE_POD_LB
		if (tunnel && tunnel->has_backend)
			be = dsr_find_named(&key, svc, &backend_id);
		if (!be && tunnel)
			be = dsr_select_local(&key, svc, hash, &backend_id);
		else if ((svc->flags & (SVC_F_MAGLEV | SVC_F_AFFINITY)) == SVC_F_MAGLEV &&
			 (backend_id = ns_maglev_backend_id(p, rev_nat_id)))
			be = bpf_map_lookup_elem(&lb_backends, &backend_id);
#endif /* SLUICE_POD_LB */
		if (!be && !tunnel)
			be = lb_select_backend_id(&key, svc, hash, ns_client_id(p), &backend_id);
		if (!be)
			return NS_DROP(tunnel ? SL_DROP_DSR_NO_SERVICE : SL_DROP_NO_BACKEND);
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
			return NS_DROP(SL_DROP_FAMILY);
#ifndef SLUICE_POD_LB
		/* A new TCP flow makes the least state it can (ct.h): a SYN
		 * only the half its SYN-ACK needs, none on a DSR LB node (the
		 * backend follows from the hash); the ACK that acknowledges
		 * the SYN-ACK completes it. */
		if (p->proto == IPPROTO_TCP) {
			if ((p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST | TCP_FLAG_FIN)) ==
			    TCP_FLAG_SYN)
				syn = true;
			else if ((kind & (CT_F_DSR | CT_F_LOCAL)) != CT_F_DSR) {
				ret = ns_complete(ctx, p, &be_addr, be_port, len);
				if (ret == 2)
					return ns_half_forward(ctx, p);
				if (ret < 0)
					return NS_DROP(SL_DROP_HANDSHAKE);
				if (ret > 0)
					goto completed;
			}
		}
#endif /* SLUICE_POD_LB */
		/* The agent is unloading for good (kube-proxy back on the
		 * node): a flow sluice has no state for (a half-open one was
		 * completed above) is the stack's, whose rules take it, while
		 * the agent hands the flows it has to netfilter's conntrack
		 * (internal/nfexport). So none is made between that hand-over
		 * and the programs' detach. */
		if (!tunnel && (cfg->flags & NS_CFG_DRAIN))
			return CTX_ACT_OK;
		/* No state, and not a flow's first packet (a TCP SYN): a flow
		 * netfilter balanced before sluice ran (kube-proxy's) stays
		 * netfilter's (nfct.h). */
		if (!tunnel && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN &&
		    ns_nf_tracked(ctx, p, len))
			return CTX_ACT_OK;
		/* A new flow only: an established one passed this check when
		 * it was created, and a half-open one when it was made (its
		 * ACK above completes it whatever the ranges say since, as
		 * conntrack's flow is past kube-proxy's NEW rules). */
		if ((svc->flags & SVC_F_SRC_RANGES) && !ns_src_range_allowed(p, rev_nat_id))
			return NS_DROP(SL_DROP_SRC_RANGE);
#ifdef SLUICE_XDP
		/* The way first, before any state: tc makes the flow of a
		 * packet XDP cannot send (ns_xdp_route). The backend from its
		 * map value: a stack copy live across the call costs the
		 * service path's frame 16 bytes. */
		if (!(kind & (CT_F_DSR | CT_F_LOCAL)) &&
		    ns_xdp_route(ctx, p, (const union lb_addr *)be->addr, be->port, NULL) < 0)
			return CTX_ACT_OK;
#endif /* SLUICE_XDP */
#ifndef SLUICE_POD_LB
		if (syn && (kind & (CT_F_DSR | CT_F_LOCAL)) == CT_F_DSR)
			e = NULL; /* no state */
		else
#endif /* SLUICE_POD_LB */
		if (ct_create_flow(cfg, p, len, now, &be_addr, be_port, backend_id,
				   rev_nat_id, kind, syn))
			return NS_DROP(SL_DROP_CT_FULL);
		e = NULL; /* replaced: the new entry learns its nat port later */
		/* A new connection, counted and told once: a DSR LB node's TCP
		 * flow was, at its SYN (which made no state). */
		created = syn || p->proto != IPPROTO_TCP || (kind & (CT_F_DSR | CT_F_LOCAL)) != CT_F_DSR;
		if (created && sl_ev_wanted(SL_EVF_SERVICE))
			sl_ns_event(p, sl_what(SL_EV_SERVICE, 0, sl_ns_mode(kind, tunnel),
					       SL_HOOK_THIS),
				    sl_rev_len(rev_nat_id, len), backend_id, ctx_ifindex(ctx));
	} else {
		__builtin_memcpy(be_addr.b, be->addr, sizeof(be_addr.b));
		be_port = be->port;
	}
	if (0) {
#ifndef SLUICE_POD_LB
completed:
		/* The flow as ct_complete made it: all from its service entry
		 * (nothing else lives across that call). */
		s = ns_scratch();
		e = s ? ct_est_lookup(&s->tuple) : NULL;
		if (!e)
			return CTX_ACT_DROP;
#ifdef SLUICE_XDP
		/* Completed here, sent by tc: it finds the flow established. */
		if (ns_xdp_established_defers(ctx, p, e))
			return CTX_ACT_OK;
#endif /* SLUICE_XDP */
		kind = e->flags & NS_KIND_FLAGS;
		rev_nat_id = e->rev_nat_id;
		backend_id = e->backend_id;
		__builtin_memcpy(be_addr.b, e->nat_addr, sizeof(be_addr.b));
		be_port = e->nat_port;
#endif /* SLUICE_POD_LB */
	}

translate:
	/* The frontend's and the backend's counters: every packet of the
	 * flow that takes this path (the flow cache adds its own). */
	sl_count(rev_nat_id, backend_id, 1, len, created);
	if (addr_is_v4(&be_addr) == p->v6)
		return NS_DROP(SL_DROP_FAMILY);
	if ((kind & (CT_F_DSR | CT_F_LOCAL)) == CT_F_DSR)
		return ns_dsr_forward(ctx, p, cfg, &be_addr, be_port);
	frontend = p->daddr;
	if (!(kind & CT_F_LOCAL) && (n || (e && ct_snat_copy(e)))) {
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
		if (NS_XDP_DEFERS(ctx, rc, fib))
			return CTX_ACT_OK;
#ifndef SLUICE_POD_LB
		/* The flow's later packets in this CT second take the cache. */
		if (e && (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == NS_FIB_KEPT))
			fc_record(p, CT_DIR_SERVICE, &node, port, &be_addr, be_port, e, now);
#endif /* SLUICE_POD_LB */
		if (pkt_rewrite_nat(ctx, p, &be_addr, be_port, &node, port))
			return CTX_ACT_DROP;
		return ns_send(ctx, p, FWD_ROUTE, fib, rc);
	}
#ifndef SLUICE_POD_LB
	if ((kind & CT_F_LOCAL) && (cfg->flags & (NS_CFG_HANDED_OVER | NS_CFG_HANDING_OVER))) {
		if (cfg->flags & NS_CFG_HANDED_OVER)
			return CTX_ACT_OK; /* netfilter's now (ct_abi.h) */
		return NS_DROP(SL_DROP_HANDOVER);
	}
#endif /* SLUICE_POD_LB */
	if (pkt_rewrite(ctx, p, true, &be_addr, be_port) ||
	    ns_rewrite_sport(ctx, p, e, created))
		return CTX_ACT_DROP;
#ifdef SLUICE_POD_LB
	if (kind & CT_F_HAIRPIN) {
		if (pkt_rewrite_addr(ctx, p, false, &frontend))
			return CTX_ACT_DROP;
		return ns_forward(ctx, p, ns_hairpin_how(&frontend), NULL, 0);
	}
#endif /* SLUICE_POD_LB */
	if (kind & CT_F_LOCAL)
		return ns_forward(ctx, p, FWD_LOCAL, NULL, 0);
#ifdef SLUICE_XDP
	/* Routed before it is translated: a new flow before its state was
	 * made (created), any other (e, the flow's entry) here. */
	if (!created && (!e || ns_xdp_established_defers(ctx, p, e)))
		return CTX_ACT_OK;
#endif /* SLUICE_XDP */
	/* A new mapping goes with its flow: a new flow's (e replaced by
	 * ct_create_flow, or still new) into snat_new, its nat port copied
	 * into the new service entry, or a half-open flow's ingress entry
	 * (its SYN-ACK's mapping alone). */
	half = created && (s = ns_scratch()) && s->half;
	if (snat_egress(ctx, p, cfg, &frontend, hash ? hash : ns_flow_hash(p), now,
			!e || (e->flags & CT_F_NEW), half))
		return NS_DROP(SL_DROP_NAT_EXHAUSTED);
	if (!e)
		ct_note_snat(&frontend, p->v6, half);
#ifdef SLUICE_XDP
	{
		struct ct_scratch *sc = ns_scratch();

		return sc ? ns_send(ctx, p, FWD_ROUTE, &sc->fib, sc->fib_rc) : CTX_ACT_DROP;
	}
#else
	return ns_forward(ctx, p, FWD_ROUTE, e, now);
#endif /* SLUICE_XDP */
}

#endif /* __SLUICE_NODEPORT_H */
