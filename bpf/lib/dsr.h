/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Direct server return through IPIP (IPv6: IP6IP6), Katran style.
 *
 *   LB node       client -> frontend, untouched, in an outer header
 *                 node IP -> the backend's node (ns_tunnel, by pod CIDR)
 *   backend node  decapsulates, load-balances the inner packet to one of
 *                 its local backends (DNAT + CT), and the reply leaves
 *                 through tc egress with the frontend as source, straight
 *                 to the client.
 *
 * The inner packet keeps the service address, so the backend node needs
 * no state from the LB node. The outer header costs 20 (40) bytes of MTU.
 */
#ifndef __SLUICE_DSR_H
#define __SLUICE_DSR_H

#include "csum.h"
#include "ct.h"

#define IPIP_TTL 64
#define DSR_LOCAL_PROBES 32

#ifndef IPPROTO_IPIP
#define IPPROTO_IPIP 4
#endif /* IPPROTO_IPIP */

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~s;
}

/* dsr_tunnel_endpoint finds the node that hosts backend. */
static __always_inline bool dsr_tunnel_endpoint(const union lb_addr *backend,
						union lb_addr *node)
{
	struct tunnel_key key = { .prefixlen = 128 };
	struct tunnel_val *val;

	__builtin_memcpy(key.addr, backend->b, sizeof(key.addr));
	val = bpf_map_lookup_elem(&ns_tunnel, &key);
	if (!val)
		return false;
	__builtin_memcpy(node->b, val->node_addr, sizeof(node->b));
	return true;
}

/* dsr_encap wraps the packet of p in an outer header src -> dst and turns p
 * into the outer packet's view (for the FIB lookup). */
static __always_inline int dsr_encap(struct __ctx_buff *ctx, struct ns_pkt *p,
				     const union lb_addr *src, const union lb_addr *dst)
{
	__u32 inner_len = ctx_len(ctx) - p->l3_off;

	if (!p->v6) {
		struct iphdr ip4 = {
			.version = 4,
			.ihl = 5,
			.tot_len = bpf_htons(inner_len + sizeof(struct iphdr)),
			.ttl = IPIP_TTL,
			.protocol = IPPROTO_IPIP,
			.saddr = src->w[3],
			.daddr = dst->w[3],
		};
		__u8 tos;

		if (ctx_load_bytes(ctx, p->l3_off + 1, &tos, 1))
			return -1;
		ip4.tos = tos;
		ip4.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip4, sizeof(ip4), 0));
		if (ctx_push_l3(ctx, sizeof(ip4), false) ||
		    ctx_store_bytes(ctx, p->l3_off, &ip4, sizeof(ip4)))
			return -1;
		p->proto = IPPROTO_IPIP;
	} else {
		struct ipv6hdr ip6 = {
			.version = 6,
			.payload_len = bpf_htons(inner_len),
			.nexthdr = IPPROTO_IPV6,
			.hop_limit = IPIP_TTL,
		};

		__builtin_memcpy(&ip6.saddr, src->b, 16);
		__builtin_memcpy(&ip6.daddr, dst->b, 16);
		if (ctx_push_l3(ctx, sizeof(ip6), true) ||
		    ctx_store_bytes(ctx, p->l3_off, &ip6, sizeof(ip6)))
			return -1;
		p->proto = IPPROTO_IPV6;
	}
	p->saddr = *src;
	p->daddr = *dst;
	p->sport = p->dport = 0;
	return 0;
}

/* dsr_is_tunnel: p is an IPIP / IP6IP6 packet to this node. */
static __always_inline bool dsr_is_tunnel(const struct ns_pkt *p)
{
	return p->proto == (p->v6 ? IPPROTO_IPV6 : IPPROTO_IPIP) &&
	       lb_is_node_addr(&p->daddr);
}

/* dsr_decap strips the outer header of p and parses the inner packet into
 * p; outer returns the sender (the LB node). */
static __always_inline int dsr_decap(struct __ctx_buff *ctx, struct ns_pkt *p,
				     union lb_addr *outer)
{
	__u32 len = p->l4_off - p->l3_off;

	*outer = p->saddr;
	if (ctx_pop_l3(ctx, len))
		return PARSE_DROP;
	return parse_pkt(ctx, p);
}

/* dsr_select_local picks a local backend of the service for a flow the LB
 * node sent here: from the hash's slot on, the first local one. */
static __always_inline const struct lb_backend *
dsr_select_local(struct lb_svc_key *key, const struct lb_svc_val *svc, __u32 hash,
		 __u32 *backend_id)
{
	const struct lb_backend *be;
	int i;

	for (i = 0; i < DSR_LOCAL_PROBES; i++) {
		be = lb_backend_of_slot(key, (__u16)((hash + i) % svc->count) + 1, backend_id);
		if (be && (be->flags & BE_F_LOCAL))
			return be;
	}
	return NULL;
}

#endif /* __SLUICE_DSR_H */
