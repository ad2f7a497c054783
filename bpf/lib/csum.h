/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Address and port rewrites that keep the L3 and L4 checksums valid, for
 * both families, through the ctx checksum helpers. */
#ifndef __SLUICE_CSUM_H
#define __SLUICE_CSUM_H

#include "l4.h"

#ifndef BPF_F_IPV6
#define BPF_F_IPV6 (1ULL << 7) /* bpf_l4_csum_replace, 6.16 */
#endif /* BPF_F_IPV6 */

/* BPF_F_IPV6 where bpf_l4_csum_replace takes it (6.16), set at load from
 * the probe; 0 before. A change of an IPv6 address in the pseudo header
 * leaves the packet's sum unchanged (the L4 checksum's change cancels it),
 * and without the flag the helper also moves skb->csum of a
 * CHECKSUM_COMPLETE packet (a NIC's receive checksum): the stack then
 * finds it wrong, logs "hw csum failure" and checks in software. The
 * flag's first user was Cilium's IPv6 reverse SNAT. */
volatile const __u32 csum_v6_flag = 0;

static __always_inline __u64 l4_csum_flags(const struct ns_pkt *p)
{
	/* A UDP checksum of 0 means "none" and must stay 0; a computed 0 is
	 * sent as 0xffff. */
	return p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
}

/* pkt_rewrite_addr replaces the destination (dst) or source address of p
 * with to, in the packet and in p. */
static __always_inline int pkt_rewrite_addr(struct __ctx_buff *ctx, struct ns_pkt *p,
					    bool dst, const union lb_addr *to)
{
	union lb_addr *cur = dst ? &p->daddr : &p->saddr;
	__u32 csum_off = l4_csum_off(p);
	__u64 flags = l4_csum_flags(p) | BPF_F_PSEUDO_HDR;
	__u32 off;

	if (!p->v6) {
		__be32 from = cur->w[3], new = to->w[3];

		off = p->l3_off + (dst ? offsetof(struct iphdr, daddr) :
					 offsetof(struct iphdr, saddr));
		if (ctx_store_bytes(ctx, off, &new, sizeof(new)))
			return -1;
		if (ctx_l3_csum_replace(ctx, p->l3_off + offsetof(struct iphdr, check),
					from, new, sizeof(new)))
			return -1;
		/* ICMPv4 has no pseudo header; a later fragment no L4 header
		 * (its datagram's checksum is in the first fragment). */
		if (p->proto != IPPROTO_ICMP && ns_has_l4(p) &&
		    ctx_l4_csum_replace(ctx, csum_off, from, new, flags | sizeof(new)))
			return -1;
	} else {
		union lb_addr new = *to;
		__s64 diff;

		off = p->l3_off + (dst ? offsetof(struct ipv6hdr, daddr) :
					 offsetof(struct ipv6hdr, saddr));
		diff = bpf_csum_diff(cur->w, sizeof(cur->w), new.w, sizeof(new.w), 0);
		if (diff < 0)
			return -1;
		if (ctx_store_bytes(ctx, off, new.b, sizeof(new.b)))
			return -1;
		if (ns_has_l4(p) && ctx_l4_csum_replace(ctx, csum_off, 0, diff, flags | csum_v6_flag))
			return -1;
	}
	*cur = *to;
	return 0;
}

/* pkt_rewrite_port replaces the destination (dst) or source port of p. */
static __always_inline int pkt_rewrite_port(struct __ctx_buff *ctx, struct ns_pkt *p,
					    bool dst, __be16 to)
{
	__be16 *cur = dst ? &p->dport : &p->sport;
	__be16 from = *cur;

	if (from == to)
		return 0;
	/* A later fragment's ports are its first fragment's, not in it. */
	if (!ns_has_l4(p))
		goto done;
	if (ctx_store_bytes(ctx, p->l4_off + (dst ? 2 : 0), &to, sizeof(to)))
		return -1;
	if (ctx_l4_csum_replace(ctx, l4_csum_off(p), from, to,
				l4_csum_flags(p) | sizeof(to)))
		return -1;
done:
	*cur = to;
	return 0;
}

/* pkt_rewrite rewrites address and port on one side of p. */
static __always_inline int pkt_rewrite(struct __ctx_buff *ctx, struct ns_pkt *p,
				       bool dst, const union lb_addr *addr, __be16 port)
{
	if (pkt_rewrite_addr(ctx, p, dst, addr))
		return -1;
	return pkt_rewrite_port(ctx, p, dst, port);
}

/* pkt_rewrite_nat4 rewrites both sides of IPv4 TCP or UDP packet p (with
 * its L4 header) at once: destination daddr:dport (DNAT) and source
 * saddr:sport (SNAT), each checksum updated once. With dec_ttl, the TTL
 * is decremented in the same IP checksum update when it is above 1; it
 * returns 1 when it is not (the packet is then translated, its TTL left to
 * the stack). */
static __always_inline int pkt_rewrite_nat4(struct __ctx_buff *ctx, struct ns_pkt *p,
					    __be32 daddr, __be16 dport, __be32 saddr, __be16 sport,
					    bool dec_ttl)
{
	__u32 addrs, ports, l3;
	int ret = 0;
	struct iphdr *ip;
	__be16 *l4;

	ip = ctx_ptr(ctx, p->l3_off, sizeof(*ip));
	l4 = ctx_ptr(ctx, p->l4_off, 2 * sizeof(*l4));
	if (!ip || !l4)
		return -1;
	addrs = csum_words(p->saddr.w[3], saddr) + csum_words(p->daddr.w[3], daddr);
	ports = (__u16)~p->sport + (__u16)sport + (__u16)~p->dport + (__u16)dport;
	l3 = addrs;
	if (dec_ttl) {
		/* TTL and protocol are one checksummed 16-bit word, the TTL
		 * its high byte: the word goes down by 0x0100, which adds
		 * ~0x0100 to the sum (RFC 1624: ~m + m - 0x0100). */
		if (ip->ttl > 1) {
			l3 += (__u16)~bpf_htons(0x0100);
			ip->ttl--;
		} else {
			ret = 1;
		}
	}
	ip->saddr = saddr;
	ip->daddr = daddr;
	l4[0] = sport;
	l4[1] = dport;
	/* The pointers die with the first checksum helper (tc). */
	if (ctx_l3_csum_replace(ctx, p->l3_off + offsetof(struct iphdr, check), 0, l3, 0))
		return -1;
#ifdef SLUICE_TC
	/* The addresses are in the pseudo header, the ports are not: a
	 * CHECKSUM_PARTIAL packet's field holds the pseudo header's sum. */
	if (ctx_l4_csum_replace(ctx, l4_csum_off(p), 0, addrs, l4_csum_flags(p) | BPF_F_PSEUDO_HDR) ||
	    ctx_l4_csum_replace(ctx, l4_csum_off(p), 0, ports, l4_csum_flags(p)))
		return -1;
#else
	if (ctx_l4_csum_replace(ctx, l4_csum_off(p), 0, addrs + ports, l4_csum_flags(p)))
		return -1;
#endif /* SLUICE_TC */
	p->saddr.w[3] = saddr;
	p->daddr.w[3] = daddr;
	p->sport = sport;
	p->dport = dport;
	return ret;
}

/* pkt_rewrite_nat rewrites both sides of p at once: destination daddr:dport
 * (DNAT) and source saddr:sport (SNAT), the per-packet work of an
 * established masqueraded flow. IPv4 TCP and UDP take pkt_rewrite_nat4;
 * anything else (a later fragment too) pkt_rewrite for each side. */
static __always_inline int pkt_rewrite_nat(struct __ctx_buff *ctx, struct ns_pkt *p,
					   const union lb_addr *daddr, __be16 dport,
					   const union lb_addr *saddr, __be16 sport)
{
	if (p->v6 || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP) || !ns_has_l4(p)) {
		if (pkt_rewrite(ctx, p, true, daddr, dport))
			return -1;
		return pkt_rewrite(ctx, p, false, saddr, sport);
	}
	return pkt_rewrite_nat4(ctx, p, daddr->w[3], dport, saddr->w[3], sport, false);
}

#endif /* __SLUICE_CSUM_H */
