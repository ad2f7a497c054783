/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* One packet context for tc and XDP. The entry file defines SLUICE_TC
 * (tc_lb.c) or SLUICE_XDP (xdp_lb.c) before including; the LB, conntrack
 * and NAT code only use the ctx_* API below.
 *
 * Packet bytes are read and written through the load/store helpers
 * (bpf_skb_*_bytes, bpf_xdp_*_bytes since 5.18) instead of direct packet
 * pointers: no bounds-check dance in shared code and the same code for
 * linear and paged packets.
 */
#ifndef __SLUICE_CTX_H
#define __SLUICE_CTX_H

#include "common.h"

#if defined(SLUICE_TC) == defined(SLUICE_XDP)
#error "define exactly one of SLUICE_TC and SLUICE_XDP"
#endif /* SLUICE_TC == SLUICE_XDP */

#include <linux/pkt_cls.h>

#ifdef SLUICE_TC
#define __ctx_buff __sk_buff

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

static __always_inline int ctx_load_bytes(struct __sk_buff *ctx, __u32 off,
					  void *to, __u32 len)
{
	return bpf_skb_load_bytes(ctx, off, to, len);
}

static __always_inline int ctx_store_bytes(struct __sk_buff *ctx, __u32 off,
					   const void *from, __u32 len)
{
	return bpf_skb_store_bytes(ctx, off, from, len, 0);
}

/* ctx_push_l3 makes room for an outer IPv4 (v6: IPv6) header of len bytes
 * between the Ethernet header and the packet; ctx_pop_l3 removes it. */
static __always_inline int ctx_push_l3(struct __sk_buff *ctx, __u32 len, bool v6)
{
	return bpf_skb_adjust_room(ctx, len, BPF_ADJ_ROOM_MAC,
				   v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 :
					BPF_F_ADJ_ROOM_ENCAP_L3_IPV4);
}

static __always_inline int ctx_pop_l3(struct __sk_buff *ctx, __u32 len)
{
	return bpf_skb_adjust_room(ctx, -(__s32)len, BPF_ADJ_ROOM_MAC, 0);
}

/* The skb helpers also keep skb->csum and CHECKSUM_PARTIAL packets right
 * (tc egress sees locally generated packets with offloaded checksums). */
static __always_inline int ctx_l3_csum_replace(struct __sk_buff *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	return bpf_l3_csum_replace(ctx, off, from, to, flags);
}

static __always_inline int ctx_l4_csum_replace(struct __sk_buff *ctx, __u32 off,
					       __u64 from, __u64 to, __u64 flags)
{
	return bpf_l4_csum_replace(ctx, off, from, to, flags);
}

#else /* SLUICE_XDP */
#define __ctx_buff xdp_md

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
	return bpf_xdp_load_bytes(ctx, off, to, len);
}

static __always_inline int ctx_store_bytes(struct xdp_md *ctx, __u32 off,
					   const void *from, __u32 len)
{
	return bpf_xdp_store_bytes(ctx, off, (void *)from, len);
}

/* XDP moves the head and the Ethernet header with it. */
static __always_inline int xdp_move_head(struct xdp_md *ctx, int delta)
{
	__u8 eth[14];

	if (bpf_xdp_load_bytes(ctx, 0, eth, sizeof(eth)) ||
	    bpf_xdp_adjust_head(ctx, delta))
		return -1;
	return bpf_xdp_store_bytes(ctx, 0, eth, sizeof(eth));
}

static __always_inline int ctx_push_l3(struct xdp_md *ctx, __u32 len, bool v6)
{
	return xdp_move_head(ctx, -(int)len);
}

static __always_inline int ctx_pop_l3(struct xdp_md *ctx, __u32 len)
{
	return xdp_move_head(ctx, len);
}

/* xdp_csum_update updates the 16-bit checksum at off for a field that
 * changed from from to to (RFC 1624: HC' = ~(~HC + ~m + m')), with the
 * flags of bpf_l4_csum_replace. */
static __always_inline int xdp_csum_update(struct xdp_md *ctx, __u32 off,
					   __u64 from, __u64 to, __u64 flags)
{
	__u32 size = flags & BPF_F_HDR_FIELD_MASK;
	__u16 old, new;
	__u32 s;

	if (bpf_xdp_load_bytes(ctx, off, &old, sizeof(old)))
		return -1;
	if ((flags & BPF_F_MARK_MANGLED_0) && old == 0)
		return 0; /* UDP without checksum stays without */
	s = (__u16)~old;
	switch (size) {
	case 0: /* to is a 32-bit csum diff, from is 0 */
		s += (to & 0xffff) + ((to >> 16) & 0xffff);
		break;
	case 2:
		s += (__u16)~from + (__u16)to;
		break;
	case 4:
		s += (__u16)~from + (__u16)~(from >> 16) +
		     (__u16)to + (__u16)(to >> 16);
		break;
	default:
		return -1;
	}
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	new = ~s;
	if ((flags & BPF_F_MARK_MANGLED_0) && new == 0)
		new = 0xffff;
	return bpf_xdp_store_bytes(ctx, off, &new, sizeof(new));
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
