/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Routing for the north-south service path: the TTL of a packet this node
 * forwards itself, and the FIB lookup (route, neighbour, MTU) of the packet
 * a translation is about to make, kept in the flow's CT entry for the rest
 * of the CT second. Sending by its answer is nodeport.h's.
 */
#ifndef __SLUICE_FIB_H
#define __SLUICE_FIB_H

#include "ct.h"

#define TTL_OFF      offsetof(struct iphdr, ttl)
#define HOPLIMIT_OFF offsetof(struct ipv6hdr, hop_limit)

/* ns_dec_ttl decrements the TTL / hop limit of a packet this program
 * forwards itself; it fails when the packet must not be forwarded. */
static __always_inline int ns_dec_ttl(struct __ctx_buff *ctx, const struct ns_pkt *p)
{
	__u8 ttl;

	if (p->v6) {
		/* payload length, next header, hop limit: the 32 bits around
		 * it, for skb->csum below. */
		__be32 from, to;

		if (ctx_load_bytes(ctx, p->l3_off + HOPLIMIT_OFF - 3, &from, 4))
			return -1;
		to = from;
		ttl = ((__u8 *)&to)[3];
		if (ttl <= 1)
			return -1;
		((__u8 *)&to)[3] = ttl - 1;
		if (ctx_store_bytes(ctx, p->l3_off + HOPLIMIT_OFF, &((__u8 *)&to)[3], 1))
			return -1;
#ifdef SLUICE_TC
		/* No header checksum balances the change: a NIC's
		 * CHECKSUM_COMPLETE sum over the packet (mlx5 and others)
		 * takes it in here, or the stack finds "hw csum failure" and
		 * sums every such packet again. Any other skb: a no-op. */
		bpf_csum_update(ctx, bpf_csum_diff(&from, 4, &to, 4, 0));
#endif /* SLUICE_TC */
		return 0;
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

/* ns_gso_seg_len is the L3 length of one segment of p when p is a GSO
 * packet, else 0. At tc a packet may stand for many: merged by GRO on
 * receive (any NIC, and a veth with GRO on whose peer sends MTU-sized
 * frames), or built by a local stack with TSO, up to 64 KiB (more with BIG
 * TCP). Its gso_size payload bytes a segment are cut again on the way out,
 * by the egress device's TSO or the stack's GSO, each segment with the
 * headers: what must fit the MTU is one segment, not the whole (Cilium
 * leaves the FIB's tot_len 0 for this, which makes tc's helper check the
 * device MTU GSO-aware; the segment keeps the check exact and per route).
 * XDP sees no GSO: native XDP runs on the wire frames before GRO, and these
 * programs are not frags-aware, so a multi-buffer frame never reaches them
 * (ctx.h). */
static __always_inline __u32 ns_gso_seg_len(struct __ctx_buff *ctx, const struct ns_pkt *p)
{
#ifdef SLUICE_TC
	__u32 gso = ctx_field(ctx, gso_size), l4 = sizeof(struct udphdr); /* UDP GSO */
	__u32 l3 = p->l4_off - p->l3_off;
	__u8 doff;

	if (!gso)
		return 0;
	/* An IPv6 GSO packet's only extension header is BIG TCP's jumbo one
	 * (parse_ipv6), which its segments go without. */
	if (p->v6 && l3 > sizeof(struct ipv6hdr))
		l3 = sizeof(struct ipv6hdr);
	if (p->proto == IPPROTO_TCP) {
		if (ctx_load_bytes(ctx, p->l4_off + TCP_DOFF_OFF, &doff, 1))
			return 0;
		l4 = (doff >> 4) * 4;
	}
	return l3 + l4 + gso;
#else
	return 0;
#endif /* SLUICE_TC */
}

/* ns_mtu_len is the L3 length of p that the MTU applies to: one segment
 * of a GSO packet, else the packet's own. */
static __always_inline __u32 ns_mtu_len(struct __ctx_buff *ctx, const struct ns_pkt *p)
{
	__u32 seg = ns_gso_seg_len(ctx, p), len = ctx_len(ctx) - p->l3_off;

	return seg && seg < len ? seg : len;
}

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

/* ns_fib_addrs sets the family and addresses of a FIB question. */
static __always_inline void ns_fib_addrs(struct bpf_fib_lookup *fib, bool v6,
					 const union lb_addr *saddr, const union lb_addr *daddr)
{
	if (v6) {
		fib->family = AF_INET6;
		__builtin_memcpy(fib->ipv6_src, saddr->b, 16);
		__builtin_memcpy(fib->ipv6_dst, daddr->b, 16);
	} else {
		fib->family = AF_INET;
		fib->ipv4_src = saddr->w[3];
		fib->ipv4_dst = daddr->w[3];
	}
}

/* ns_fib_tunnel looks up the route of the tunnel packet p is about to
 * become (saddr -> daddr, protocol proto, hlen bytes of outer header),
 * before it is made: the MTU checked is the route's egress device's, on
 * one segment of a GSO packet plus the outer header. */
static __always_inline long ns_fib_tunnel(struct __ctx_buff *ctx, const struct ns_pkt *p,
					  const union lb_addr *saddr, const union lb_addr *daddr,
					  __u8 proto, __u32 hlen, struct bpf_fib_lookup *fib)
{
	__u32 len = ns_mtu_len(ctx, p);

	barrier_var(len);
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->ifindex = ctx_ifindex(ctx);
	fib->l4_protocol = proto;
	fib->tot_len = len + hlen;
	ns_fib_addrs(fib, p->v6, saddr, daddr);
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* ns_fib's answer when it took the result kept in the CT entry: a success
 * without a lookup (no BPF_FIB_LKUP_RET_* value). */
#define NS_FIB_KEPT 0x100

/* ns_fib looks up the route of p from saddr:sport to daddr:dport (p's own
 * addresses, or those it is about to be given) into fib. A routed flow
 * passes its CT entry as keep (else NULL): the FIB result is kept there and
 * its later packets in the same CT second skip the lookup, so a route or
 * neighbour change reaches an established flow within a second. The MTU
 * check is the FIB's, on ns_mtu_len: a GSO packet's segments must fit. */
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
	fib->tot_len = ns_mtu_len(ctx, p);
	if (keep && ns_fib_kept(&keep->fib, fib, now))
		return NS_FIB_KEPT;
	ns_fib_addrs(fib, p->v6, saddr, daddr);
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (keep && rc == BPF_FIB_LKUP_RET_SUCCESS) {
		fib->tot_len = ns_mtu_len(ctx, p); /* the lookup may reuse it */
		ns_fib_keep(&keep->fib, fib, now);
	}
	return rc;
}

#endif /* __SLUICE_FIB_H */
