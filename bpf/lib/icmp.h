/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMP errors about translated flows: destination unreachable (port
 * unreachable, fragmentation needed), time exceeded, ICMPv6 packet too
 * big. The error quotes the packet that caused it; both the quoted header
 * and the outer addresses are translated so the client sees an error about
 * the packet it sent, to the frontend it used.
 *
 * Each write inside the quoted packet is balanced in the ICMP checksum,
 * and so are the changes of the quoted IP and L4 checksums: the message
 * stays valid without a full recompute, in tc and XDP alike.
 */
#ifndef __SLUICE_ICMP_H
#define __SLUICE_ICMP_H

#include "csum.h"
#include "ct.h"

#define ICMP_ERR_HLEN 8 /* type, code, checksum, unused / mtu */

static __always_inline bool icmp_is_error(const struct ns_pkt *p, __u8 type)
{
	if (p->v6)
		return type == ICMPV6_DEST_UNREACH || type == ICMPV6_PKT_TOOBIG ||
		       type == ICMPV6_TIME_EXCEED;
	return type == ICMP_DEST_UNREACH || type == ICMP_TIME_EXCEEDED;
}

/* icmp_parse_error fills e when p is an ICMP error quoting TCP or UDP. */
static __always_inline int icmp_parse_error(struct __ctx_buff *ctx, const struct ns_pkt *p,
					    struct icmp_err *e)
{
	struct ns_pkt *q = &e->inner;
	__u32 off = p->l4_off + ICMP_ERR_HLEN;
	__u16 ck;
	__u8 type;
	int ret;

	if (ctx_load_bytes(ctx, p->l4_off, &type, 1) || !icmp_is_error(p, type))
		return PARSE_SKIP;
	__builtin_memset(e, 0, sizeof(*e));
	q->l3_off = off;
	ret = p->v6 ? parse_ipv6(ctx, q, true) : parse_ipv4(ctx, q, true);
	if (ret != PARSE_OK)
		return ret;
	if (q->proto != IPPROTO_TCP && q->proto != IPPROTO_UDP)
		return PARSE_SKIP;
	e->csum_off = l4_csum_off(p);
	off = l4_csum_off(q);
	/* A zero UDP checksum is "none" and stays so. */
	if (!ctx_load_bytes(ctx, off, &ck, sizeof(ck)) &&
	    (ck || q->proto != IPPROTO_UDP))
		e->inner_l4_csum = off;
	return PARSE_OK;
}

/* icmp_csum_change updates the ICMP checksum for a field of the quoted
 * packet that changed (size 2 or 4, or 0 with a csum diff in to). */
static __always_inline int icmp_csum_change(struct __ctx_buff *ctx, const struct icmp_err *e,
					    __u64 from, __u64 to, __u64 size)
{
	return ctx_l3_csum_replace(ctx, e->csum_off, from, to, size);
}

/* icmp_fix_inner_csum applies a change to the checksum at off inside the
 * quoted packet and carries its own change into the ICMP checksum. */
static __always_inline int icmp_fix_inner_csum(struct __ctx_buff *ctx, const struct icmp_err *e,
					       __u32 off, __u64 from, __u64 to, __u64 size)
{
	__u16 old, new;

	if (ctx_load_bytes(ctx, off, &old, sizeof(old)) ||
	    ctx_l3_csum_replace(ctx, off, from, to, size) ||
	    ctx_load_bytes(ctx, off, &new, sizeof(new)))
		return -1;
	return icmp_csum_change(ctx, e, old, new, 2);
}

/* icmp_rewrite_inner replaces the quoted packet's destination (dst) or
 * source address and port. */
static __always_inline int icmp_rewrite_inner(struct __ctx_buff *ctx, struct icmp_err *e,
					      bool dst, const union lb_addr *addr, __be16 port)
{
	struct ns_pkt *q = &e->inner;
	union lb_addr *cur = dst ? &q->daddr : &q->saddr;
	__be16 *cur_port = dst ? &q->dport : &q->sport;
	__be16 old_port = *cur_port;

	if (!q->v6) {
		__be32 from = cur->w[3], to = addr->w[3];
		__u32 off = q->l3_off + (dst ? offsetof(struct iphdr, daddr) :
					       offsetof(struct iphdr, saddr));

		if (ctx_store_bytes(ctx, off, &to, sizeof(to)) ||
		    icmp_csum_change(ctx, e, from, to, 4) ||
		    icmp_fix_inner_csum(ctx, e, q->l3_off + offsetof(struct iphdr, check),
					from, to, 4))
			return -1;
		if (e->inner_l4_csum &&
		    icmp_fix_inner_csum(ctx, e, e->inner_l4_csum, from, to, 4))
			return -1;
	} else {
		union lb_addr to = *addr;
		__u32 off = q->l3_off + (dst ? offsetof(struct ipv6hdr, daddr) :
					       offsetof(struct ipv6hdr, saddr));
		__s64 diff = bpf_csum_diff(cur->w, sizeof(cur->w), to.w, sizeof(to.w), 0);

		if (diff < 0 || ctx_store_bytes(ctx, off, to.b, sizeof(to.b)) ||
		    icmp_csum_change(ctx, e, 0, diff, 0))
			return -1;
		if (e->inner_l4_csum &&
		    icmp_fix_inner_csum(ctx, e, e->inner_l4_csum, 0, diff, 0))
			return -1;
	}
	*cur = *addr;

	if (old_port == port)
		return 0;
	if (ctx_store_bytes(ctx, q->l4_off + (dst ? 2 : 0), &port, sizeof(port)) ||
	    icmp_csum_change(ctx, e, old_port, port, 2))
		return -1;
	if (e->inner_l4_csum &&
	    icmp_fix_inner_csum(ctx, e, e->inner_l4_csum, old_port, port, 2))
		return -1;
	*cur_port = port;
	return 0;
}

/* icmp_rev_dnat gives an error about a flow to backend (quoted: client ->
 * backend, after DNAT) the frontend back: quoted destination, and outer
 * source when the backend itself sent the error. Returns 1 when the flow
 * is tracked, 0 when not, < 0 on error. */
static __always_inline int icmp_rev_dnat(struct __ctx_buff *ctx, struct ns_pkt *p,
					 struct icmp_err *e)
{
	struct ns_pkt *q = &e->inner;
	union lb_addr fe __align_stack_8;
	union lb_addr backend = q->daddr;
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *ce;

	if (!s)
		return -1;
	ct_tuple_set(&s->tuple, &q->saddr, &q->daddr, q->sport, q->dport, q->proto,
		     CT_DIR_INGRESS);
	ce = ct_lookup_in(&s->tuple);
	if (!ce)
		return 0;
	__builtin_memcpy(fe.b, ce->nat_addr, sizeof(fe.b));
	if (icmp_rewrite_inner(ctx, e, true, &fe, ce->nat_port))
		return -1;
	/* A flow whose client port was rewritten: the client's own. */
	if ((ce->flags & CT_F_SPORT) &&
	    icmp_rewrite_inner(ctx, e, false, &q->saddr, ce->snat_port))
		return -1;
	if (addr_equal(&backend, p->saddr.b) && pkt_rewrite_addr(ctx, p, false, &fe))
		return -1;
	return 1;
}

/* icmp_rev_snat translates an error sent to a nat port of this node about
 * a masqueraded flow (quoted: node:nat port -> backend) for the client:
 * quoted source and outer destination become the client, then
 * icmp_rev_dnat restores the frontend. Returns 1 when the flow is known,
 * 0 when not, < 0 on error. */
static __always_inline int icmp_rev_snat(struct __ctx_buff *ctx, struct ns_pkt *p,
					 struct icmp_err *e)
{
	struct ns_pkt *q = &e->inner;
	union lb_addr client __align_stack_8;
	struct ct_scratch *s = ns_scratch();
	struct nat_entry *n;
	__be16 port;

	if (!s)
		return -1;
	ct_tuple_set(&s->tuple, &q->daddr, &q->saddr, q->dport, q->sport, q->proto,
		     NAT_DIR_INGRESS);
	n = snat_lookup_in(&s->tuple);
	if (!n)
		return 0;
	__builtin_memcpy(client.b, n->to_addr, sizeof(client.b));
	port = n->to_port;
	if (icmp_rewrite_inner(ctx, e, false, &client, port) ||
	    pkt_rewrite_addr(ctx, p, true, &client))
		return -1;
	return icmp_rev_dnat(ctx, p, e) > 0 ? 1 : -1;
}

/* icmp_to_backend translates an error from the client's side about a
 * reply this node translated (quoted: frontend -> client) for the backend
 * that sent the reply: the quoted source becomes the backend; for a
 * masqueraded flow the quoted destination becomes node:nat port and the
 * outer source the node, as the backend knows the flow. The outer
 * destination becomes the backend. A path MTU drop between client and
 * node thus reaches the backend whose replies are too big. Returns 1 with
 * *local set when the flow is known, 2 for a DSR flow of this LB node (its
 * reply bypassed this node; the backend in the scratch's nat, the error
 * untouched: it goes to the backend's node in the flow's tunnel, whose
 * entry there is a local one), 0 when not known, < 0 on error. */
static __always_inline int icmp_to_backend(struct __ctx_buff *ctx, struct ns_pkt *p,
					   struct icmp_err *e, bool *local)
{
	struct ns_pkt *q = &e->inner;
	union lb_addr addr __align_stack_8;
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *ce;
	struct nat_entry *n;
	__be16 port;

	if (!s)
		return -1;
	ct_tuple_set(&s->tuple, &q->daddr, &q->saddr, q->dport, q->sport, q->proto,
		     CT_DIR_SERVICE);
	ce = ct_lookup(&s->tuple);
	if (!ce)
		return 0;
	/* A DSR flow of this LB node: its reply left the backend's node
	 * with the frontend's address, so the error came here. The backend
	 * goes into the scratch's nat for the tunnel (ns_dsr_forward). */
	if ((ce->flags & (CT_F_DSR | CT_F_LOCAL)) == CT_F_DSR) {
		__builtin_memcpy(s->nat.to_addr, ce->nat_addr, sizeof(s->nat.to_addr));
		s->nat.to_port = ce->nat_port;
		return 2;
	}
	*local = ce->flags & CT_F_LOCAL;
	/* A flow whose client port was rewritten: the port the backend
	 * knows the client by. */
	if ((ce->flags & CT_F_SPORT) &&
	    icmp_rewrite_inner(ctx, e, true, &q->daddr, ce->snat_port))
		return -1;
	__builtin_memcpy(addr.b, ce->nat_addr, sizeof(addr.b));
	port = ce->nat_port;
	/* The client-side tuple of the masquerading, before the quote changes. */
	ct_tuple_set(&s->tuple, &q->daddr, &addr, q->dport, port, q->proto, NAT_DIR_EGRESS);
	if (!*local) {
		/* Where the masquerading sends it, into the scratch: the
		 * mapping, or when a flood evicted it (snat_new churns) its
		 * copy in the service entry, as the forward path uses it, from
		 * the quoted frontend (q->saddr before the rewrite below) or
		 * the configured address. */
		n = snat_lookup(&s->tuple);
		if (n) {
			__builtin_memcpy(s->nat.to_addr, n->to_addr, sizeof(s->nat.to_addr));
			s->nat.to_port = n->to_port;
		} else {
			const struct ns_config *cfg = ns_cfg();

			if (!cfg || !ct_snat_copy(ce))
				return -1;
			__builtin_memcpy(s->nat.to_addr, snat_copy_source(cfg, ce, p->v6, &q->saddr)->b,
					 sizeof(s->nat.to_addr));
			s->nat.to_port = ce->snat_port;
		}
	}
	if (icmp_rewrite_inner(ctx, e, false, &addr, port) ||
	    pkt_rewrite_addr(ctx, p, true, &addr))
		return -1;
	if (*local)
		return 1;
	__builtin_memcpy(addr.b, s->nat.to_addr, sizeof(addr.b));
	port = s->nat.to_port;
	if (icmp_rewrite_inner(ctx, e, true, &addr, port) ||
	    pkt_rewrite_addr(ctx, p, false, &addr))
		return -1;
	return 1;
}

#endif /* __SLUICE_ICMP_H */
