/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* One packet context for tc and XDP. The entry file defines SLUICE_TC
 * (tc_lb.c) or SLUICE_XDP (xdp_lb.c) before including; the LB, conntrack
 * and NAT code only use the ctx_* API below.
 *
 * Packet bytes are read and written with direct packet access only. At
 * XDP there is nothing beyond the frame: the programs are not frags-aware
 * (SEC("xdp"), no BPF_F_XDP_HAS_FRAGS), so the kernel only gives them
 * single-buffer frames. At tc, ctx_linearize pulls the first CTX_PULL_LEN
 * bytes (every header the LB reads, ICMP errors' quoted headers included)
 * into the linear part once, on entry, when they are not there already
 * (headers of a GRO or locally built GSO skb are). An access outside then
 * fails like a truncated packet. Without a helper path per access the
 * verifier walks a fraction of the paths (xdp_lb_ingress ~135K instead of
 * ~715K instructions, tc_lb_ingress likewise), and the agent starts faster.
 * A helper call costs tens of nanoseconds, a direct access one instruction,
 * and the API keeps shared code free of the bounds-check dance: every call
 * checks its own bounds, with constant lengths that clang folds.
 */
#ifndef __SLUICE_CTX_H
#define __SLUICE_CTX_H

#include "common.h"

#if defined(SLUICE_TC) == defined(SLUICE_XDP)
#error "define exactly one of SLUICE_TC and SLUICE_XDP"
#endif /* SLUICE_TC == SLUICE_XDP */

#include <linux/pkt_cls.h>
#include <stddef.h>

/* Direct access reaches this far into the packet: enough for every header
 * the LB reads, and a bound the verifier needs before it adds a variable
 * offset to a packet pointer. */
#define CTX_DIRECT_MAX 0xfff

#ifdef SLUICE_TC
#define __ctx_buff __sk_buff
#else /* SLUICE_XDP */
#define __ctx_buff xdp_md
#endif /* SLUICE_TC */

/* ctx_ptr returns a pointer to len bytes at off, or NULL when they are not
 * in directly accessible memory. The pointer lives until the next helper
 * that may move the packet (csum, adjust, pull). */
/* ctx_field loads a u32 field of the context in one instruction on the
 * unmodified ctx register: left to itself, clang hoists &ctx->data_end out
 * of the many inlined accesses, and the verifier rejects a load through a
 * modified ctx pointer. */
#define ctx_field(ctx, field) ({					\
	__u64 __v; /* the load zero-extends */			\
	asm volatile("%0 = *(u32 *)(%1 + %2)"				\
		     : "=r"(__v)					\
		     : "r"(ctx), "i"(offsetof(struct __ctx_buff, field)));	\
	__v;								\
})

static __always_inline void *ctx_ptr(const struct __ctx_buff *ctx, __u32 off, __u32 len)
{
	void *data = (void *)(long)ctx_field(ctx, data);
	void *end = (void *)(long)ctx_field(ctx, data_end);
	__u64 o = off;

	if (o > CTX_DIRECT_MAX)
		return NULL;
	/* Hidden from clang, so the bounded register is the one added to the
	 * packet pointer: otherwise clang may check one copy of off and add
	 * another, which the verifier cannot relate. */
	asm volatile("%0 &= %1" : "+r"(o) : "i"(CTX_DIRECT_MAX));
	if (data + o + len > end)
		return NULL;
	return data + o;
}

/* Headers sit at any byte offset; x86 and arm64 JITs load them unaligned
 * at no cost and the verifier allows it on packets (no strict alignment).
 * Claiming alignment lets clang copy in words instead of bytes; the stack
 * side keeps its own, real alignment. */
#define ctx_pkt_aligned(p) __builtin_assume_aligned(p, 8)

/* csum_words is the ones' complement sum change, unfolded, of a 32-bit
 * field going from from to to (RFC 1624: ~m + m'). */
static __always_inline __u32 csum_words(__u32 from, __u32 to)
{
	return (__u16)~from + (__u16)~(from >> 16) + (__u16)to + (__u16)(to >> 16);
}

/* csum_replace updates the 16-bit ones' complement checksum at sum for a
 * field that changed from from to to (RFC 1624: HC' = ~(~HC + ~m + m')),
 * the arithmetic of the kernel's csum_replace{2,4,_by_diff}. size is 2 or
 * 4, or 0 when to is a 32-bit checksum diff (bpf_csum_diff) and from is 0.
 * mangled_0: a UDP checksum of 0 means "none" and stays 0, and a computed
 * 0 is sent as 0xffff. */
static __always_inline int csum_replace(__u16 *sum, __u64 from, __u64 to, __u32 size,
					bool mangled_0)
{
	__u16 old = *sum, new;
	__u32 s;

	if (mangled_0 && old == 0)
		return 0;
	s = (__u16)~old;
	switch (size) {
	case 0:
		s += (to & 0xffff) + ((to >> 16) & 0xffff);
		break;
	case 2:
		s += (__u16)~from + (__u16)to;
		break;
	case 4:
		s += csum_words(from, to);
		break;
	default:
		return -1;
	}
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	new = ~s;
	if (mangled_0 && new == 0)
		new = 0xffff;
	*sum = new;
	return 0;
}

#ifdef SLUICE_TC
#define CTX_ACT_OK       TC_ACT_OK
#define CTX_ACT_DROP     TC_ACT_SHOT
#define CTX_ACT_TX       TC_ACT_REDIRECT /* never returned: tc has no TX */
#define CTX_ACT_REDIRECT TC_ACT_REDIRECT

static __always_inline __u32 ctx_len(const struct __sk_buff *ctx)
{
	return ctx->len;
}

static __always_inline __u32 ctx_ifindex(const struct __sk_buff *ctx)
{
	return ctx->ingress_ifindex ? ctx->ingress_ifindex : ctx->ifindex;
}

/* The deepest header byte the LB reads: Ethernet, IPv4 with options, an
 * ICMP header, the quoted IPv4 header with options and its ports (150), or
 * a DSR outer header, the inner one and TCP's flags. */
#define CTX_PULL_LEN 160

/* ctx_linearize makes the first CTX_PULL_LEN bytes (or the whole packet,
 * when shorter) directly accessible. Call it first: it moves the packet. */
static __always_inline int ctx_linearize(struct __sk_buff *ctx)
{
	__u32 want = ctx->len < CTX_PULL_LEN ? ctx->len : CTX_PULL_LEN;

	if (ctx_field(ctx, data_end) - ctx_field(ctx, data) >= want)
		return 0;
	return bpf_skb_pull_data(ctx, want);
}

static __always_inline int ctx_load_bytes(struct __sk_buff *ctx, __u32 off,
					  void *to, __u32 len)
{
	void *p = ctx_ptr(ctx, off, len);

	if (p) {
		__builtin_memcpy(to, ctx_pkt_aligned(p), len);
		return 0;
	}
	return -1; /* past the linear part, which ctx_linearize made long enough */
}

/* A direct write makes the verifier unclone the skb head in the program's
 * prologue; it does not touch skb->csum, and the checksum fields that
 * balance the change are updated next. */
static __always_inline int ctx_store_bytes(struct __sk_buff *ctx, __u32 off,
					   const void *from, __u32 len)
{
	void *p = ctx_ptr(ctx, off, len);

	if (p) {
		__builtin_memcpy(ctx_pkt_aligned(p), from, len);
		return 0;
	}
	return -1;
}

/* ctx_push_l3 makes room for an outer IPv4 (v6: IPv6) header of len bytes
 * between the Ethernet header and the packet; ctx_pop_l3 removes it. A
 * GSO packet keeps its gso_size (BPF_F_ADJ_ROOM_FIXED_GSO): each segment
 * leaves len bytes longer, which the caller's MTU check (ns_fib_tunnel, on
 * one segment plus len) has counted. Without the flag the kernel shrinks a
 * TCP packet's segments, and refuses a UDP GSO packet, whose gso_size
 * delineates its datagrams (a QUIC server's sends, UDP GRO). */
static __always_inline int ctx_push_l3(struct __sk_buff *ctx, __u32 len, bool v6)
{
	return bpf_skb_adjust_room(ctx, len, BPF_ADJ_ROOM_MAC,
				   (v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 :
					 BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) |
				   BPF_F_ADJ_ROOM_FIXED_GSO);
}

/* ctx_push_udp is ctx_push_l3 for an outer IP and UDP header and what
 * follows it (GUE), len bytes in all: a GSO packet becomes a UDP tunnel's
 * (SKB_GSO_UDP_TUNNEL), whose segments each get the outer headers. */
static __always_inline int ctx_push_udp(struct __sk_buff *ctx, __u32 len, bool v6)
{
	return bpf_skb_adjust_room(ctx, len, BPF_ADJ_ROOM_MAC,
				   (v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 :
					 BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) |
				   BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_FIXED_GSO);
}

/* ctx_pop_l3 keeps a GSO packet's gso_size too: an aggregate GRO merged
 * under the outer headers (a GUE port's, wire_gro.go) has the inner
 * segments' size already, which the kernel would otherwise raise by len. */
static __always_inline int ctx_pop_l3(struct __sk_buff *ctx, __u32 len)
{
	return bpf_skb_adjust_room(ctx, -(__s32)len, BPF_ADJ_ROOM_MAC,
				   BPF_F_ADJ_ROOM_FIXED_GSO);
}

/* ctx_grow_head inserts len bytes between the Ethernet header and the
 * packet (no encapsulation flags: the packet becomes a new one). */
static __always_inline int ctx_grow_head(struct __sk_buff *ctx, __u32 len)
{
	return bpf_skb_adjust_room(ctx, len, BPF_ADJ_ROOM_MAC, 0);
}

/* ctx_set_len cuts (or extends) the packet to len bytes from the Ethernet
 * header on. */
static __always_inline int ctx_set_len(struct __sk_buff *ctx, __u32 len)
{
	return bpf_skb_change_tail(ctx, len, 0);
}

/* ctx_reply sends the packet back out of the device it came in on. */
static __always_inline int ctx_reply(struct __sk_buff *ctx)
{
	return bpf_redirect(ctx_ifindex(ctx), 0);
}

/* The IPv4 header checksum is plain arithmetic on the header, what
 * bpf_l3_csum_replace does, so it is done in place. */
static __always_inline int ctx_l3_csum_replace(struct __sk_buff *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	__u16 *sum = ctx_ptr(ctx, off, sizeof(*sum));

	if (!sum)
		return -1;
	return csum_replace(sum, from, to, flags & BPF_F_HDR_FIELD_MASK, false);
}

/* L4 checksums stay with the helper: it also keeps skb->csum
 * (CHECKSUM_COMPLETE) and CHECKSUM_PARTIAL packets right, whose checksum
 * field holds only the pseudo header sum (veth from a local stack). */
static __always_inline int ctx_l4_csum_replace(struct __sk_buff *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	return bpf_l4_csum_replace(ctx, off, from, to, flags);
}

#else /* SLUICE_XDP */
#define CTX_ACT_OK       XDP_PASS
#define CTX_ACT_DROP     XDP_DROP
#define CTX_ACT_TX       XDP_TX
#define CTX_ACT_REDIRECT XDP_REDIRECT

static __always_inline __u32 ctx_len(const struct xdp_md *ctx)
{
	return ctx->data_end - ctx->data;
}

static __always_inline __u32 ctx_ifindex(const struct xdp_md *ctx)
{
	return ctx->ingress_ifindex;
}

static __always_inline int ctx_load_bytes(struct xdp_md *ctx, __u32 off,
					  void *to, __u32 len)
{
	void *p = ctx_ptr(ctx, off, len);

	if (p) {
		__builtin_memcpy(to, ctx_pkt_aligned(p), len);
		return 0;
	}
	return -1; /* outside the (only) buffer: truncated */
}

/* A frame is one buffer: nothing to pull. */
static __always_inline int ctx_linearize(struct xdp_md *ctx)
{
	return 0;
}

static __always_inline int ctx_store_bytes(struct xdp_md *ctx, __u32 off,
					   const void *from, __u32 len)
{
	void *p = ctx_ptr(ctx, off, len);

	if (p) {
		__builtin_memcpy(ctx_pkt_aligned(p), from, len);
		return 0;
	}
	return -1; /* outside the (only) buffer */
}

/* XDP moves the head and the Ethernet header with it. */
static __always_inline int xdp_move_head(struct xdp_md *ctx, int delta)
{
	__u8 eth[14] __align_stack_8;

	if (ctx_load_bytes(ctx, 0, eth, sizeof(eth)) ||
	    bpf_xdp_adjust_head(ctx, delta))
		return -1;
	return ctx_store_bytes(ctx, 0, eth, sizeof(eth));
}

static __always_inline int ctx_push_l3(struct xdp_md *ctx, __u32 len, bool v6)
{
	return xdp_move_head(ctx, -(int)len);
}

static __always_inline int ctx_push_udp(struct xdp_md *ctx, __u32 len, bool v6)
{
	return xdp_move_head(ctx, -(int)len);
}

static __always_inline int ctx_pop_l3(struct xdp_md *ctx, __u32 len)
{
	return xdp_move_head(ctx, len);
}

static __always_inline int ctx_grow_head(struct xdp_md *ctx, __u32 len)
{
	return xdp_move_head(ctx, -(int)len);
}

static __always_inline int ctx_set_len(struct xdp_md *ctx, __u32 len)
{
	__u32 cur = ctx_len(ctx);

	/* A 32-bit length, never folded into arithmetic on data_end, which
	 * the verifier refuses. */
	asm volatile("" : "+r"(cur));
	return bpf_xdp_adjust_tail(ctx, (int)len - (int)cur);
}

static __always_inline int ctx_reply(struct xdp_md *ctx)
{
	return XDP_TX;
}

/* xdp_csum_update updates the 16-bit checksum at off, with the flags of
 * bpf_l4_csum_replace. */
static __always_inline int xdp_csum_update(struct xdp_md *ctx, __u32 off,
					   __u64 from, __u64 to, __u64 flags)
{
	bool mangled_0 = flags & BPF_F_MARK_MANGLED_0;
	__u32 size = flags & BPF_F_HDR_FIELD_MASK;
	__u16 *p = ctx_ptr(ctx, off, sizeof(*p));

	if (!p)
		return -1;
	return csum_replace(p, from, to, size, mangled_0);
}

static __always_inline int ctx_l3_csum_replace(struct xdp_md *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	return xdp_csum_update(ctx, off, from, to, flags);
}

/* XDP sees full checksums only (no CHECKSUM_PARTIAL), so the pseudo header
 * flag changes nothing. */
static __always_inline int ctx_l4_csum_replace(struct xdp_md *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	return xdp_csum_update(ctx, off, from, to, flags & ~BPF_F_PSEUDO_HDR);
}
#endif /* SLUICE_TC */

#endif /* __SLUICE_CTX_H */
