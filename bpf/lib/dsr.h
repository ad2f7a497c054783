/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Direct server return through IPIP (IPv6: IP6IP6), Katran style.
 *
 *   LB node       client -> frontend, untouched, in an outer header
 *                 node IP -> the backend's node (ns_tunnel: the backend's
 *                 host prefix, else its pod CIDR; neither: SNAT instead)
 *                 that names the backend the LB node chose
 *   backend node  decapsulates, delivers the inner packet to that backend
 *                 (DNAT + CT), and the reply leaves through tc egress with
 *                 the frontend as source, straight to the client.
 *
 * The inner packet keeps the service address; the chosen backend's address
 * and port ride in the outer header: an IPv4 option (8 bytes), an IPv6
 * destination options header (24 bytes), both of the experimental type of
 * RFC 4727. So Maglev's and ClientIP affinity's choice holds across nodes
 * whatever the number of backends. The outer header costs 28 (64) bytes
 * of MTU. A packet without the option (an LB node of an older sluice) gets
 * one of the node's local backends, as before.
 */
#ifndef __SLUICE_DSR_H
#define __SLUICE_DSR_H

#include "csum.h"
#include "ct.h"
#include "icmp.h"

#define IPIP_TTL 64
#define DSR_LOCAL_PROBES 32

#ifndef IPPROTO_DSTOPTS
#define IPPROTO_DSTOPTS 60
#endif /* IPPROTO_DSTOPTS */


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

#define DSR_IP4_DF 0x4000 /* IPv4 don't fragment, host order */

/* dsr_gue_on: this node sends DSR in GUE (--dsr-dispatch=gue). */
static __always_inline bool dsr_gue_on(const struct ns_config *cfg)
{
	return cfg && cfg->dsr_gue_port && (cfg->flags & NS_CFG_DSR_GUE);
}

/* dsr_outer4 fills the outer IPv4 header of a packet of tot bytes in the
 * scratch, but its checksum (the IPIP header's option is summed with it),
 * from this node's address to the tunnel's end (dsr_info's node). DF as
 * the inner packet says, as Linux's IPIP tunnels do with path MTU
 * discovery: a router on the way answers the client's DF packets (to this
 * node, which is what the stack learns from). Without DF the outer packet
 * may be fragmented, so it needs an ID of its own (RFC 6864: ID 0 only for
 * atomic datagrams). The caller zeroed it. */
static __always_inline int dsr_outer4(struct __ctx_buff *ctx, const struct ns_pkt *p,
				      const struct ns_config *cfg, struct ct_scratch *s,
				      struct iphdr *ip4, __u32 hlen, __u8 proto, __u32 tot)
{
	if (ctx_load_bytes(ctx, p->l3_off + 1, &ip4->tos, 1) ||
	    ctx_load_bytes(ctx, p->l3_off + offsetof(struct iphdr, frag_off), &ip4->frag_off, 2))
		return -1;
	ip4->version = 4;
	ip4->ihl = hlen / 4;
	ip4->tot_len = bpf_htons(tot);
	ip4->ttl = IPIP_TTL;
	ip4->protocol = proto;
	ip4->saddr = snat_conf_addr(cfg, false)->w[3];
	ip4->daddr = s->dsr.info.node.w[3];
	ip4->frag_off &= bpf_htons(DSR_IP4_DF);
	if (!ip4->frag_off)
		ip4->id = (__be16)bpf_get_prandom_u32();
	return 0;
}

/* dsr_outer6 fills the outer IPv6 header in the scratch, its flow label
 * from the inner flow's hash (RFC 6438): every packet an LB node tunnels
 * to one node has the same addresses, and a fabric's ECMP (and Linux's
 * multipath hash) spreads IPv6 by the label too. The caller zeroed it. */
static __always_inline void dsr_outer6(const struct ns_config *cfg, struct ct_scratch *s,
				       struct ipv6hdr *ip6, __u8 nexthdr, __u32 payload)
{
	__u32 label = s->dsr.info.hash;

	ip6->version = 6;
	ip6->flow_lbl[0] = (label >> 16) & 0x0f;
	ip6->flow_lbl[1] = label >> 8;
	ip6->flow_lbl[2] = label;
	ip6->payload_len = bpf_htons(payload);
	ip6->nexthdr = nexthdr;
	ip6->hop_limit = IPIP_TTL;
	__builtin_memcpy(&ip6->saddr, snat_conf_addr(cfg, true)->b, 16);
	__builtin_memcpy(&ip6->daddr, s->dsr.info.node.b, 16);
}

/* dsr_encap_ipip: the outer header is IPIP (IP6IP6) with the backend in an
 * IPv4 option (an IPv6 destination options header). */
static __always_inline int dsr_encap_ipip(struct __ctx_buff *ctx, struct ns_pkt *p,
					  const struct ns_config *cfg, struct ct_scratch *s,
					  __u32 inner_len)
{
	const struct dsr_info *d = &s->dsr.info;

	if (!p->v6) {
		struct dsr_opt4 *o = &s->dsr.h4.opt;

		__builtin_memset(&s->dsr.h4, 0, sizeof(s->dsr.h4));
		if (dsr_outer4(ctx, p, cfg, s, &s->dsr.h4.ip, sizeof(s->dsr.h4), IPPROTO_IPIP,
			       inner_len + sizeof(s->dsr.h4)))
			return -1;
		o->type = DSR_OPT4_TYPE;
		o->len = sizeof(*o);
		o->port = d->port;
		o->addr = d->backend.w[3];
		s->dsr.h4.ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&s->dsr.h4,
							     sizeof(s->dsr.h4), 0));
		if (ctx_push_l3(ctx, sizeof(s->dsr.h4), false) ||
		    ctx_store_bytes(ctx, p->l3_off, &s->dsr.h4, sizeof(s->dsr.h4)))
			return -1;
		p->proto = IPPROTO_IPIP;
	} else {
		struct dsr_opt6 *o = &s->dsr.h6.opt;

		__builtin_memset(&s->dsr.h6, 0, sizeof(s->dsr.h6));
		dsr_outer6(cfg, s, &s->dsr.h6.ip, IPPROTO_DSTOPTS, inner_len + sizeof(*o));
		o->nexthdr = IPPROTO_IPV6;
		o->hdrlen = sizeof(*o) / 8 - 1;
		o->type = DSR_OPT6_TYPE;
		o->len = sizeof(o->port) + sizeof(o->addr);
		o->port = d->port;
		__builtin_memcpy(o->addr, d->backend.b, 16);
		o->pad_type = 1;
		if (ctx_push_l3(ctx, sizeof(s->dsr.h6), true) ||
		    ctx_store_bytes(ctx, p->l3_off, &s->dsr.h6, sizeof(s->dsr.h6)))
			return -1;
		p->proto = IPPROTO_IPV6;
	}
	return 0;
}

/* dsr_gue_sport is the outer UDP source port: the flow's hash h in the
 * dynamic range (49152-65535, as RFC 7510 asks of MPLS in UDP). Each flow
 * keeps one path and one RX queue; one LB node's flows spread over all. */
static __always_inline __be16 dsr_gue_sport(__u32 h)
{
	return bpf_htons(0xc000 | ((h ^ (h >> 16)) & 0x3fff));
}

#define DSR_GUE4_HLEN (sizeof(struct iphdr) + sizeof(struct udphdr) + DSR_GUE4_LEN)
#define DSR_GUE6_HLEN (sizeof(struct ipv6hdr) + sizeof(struct udphdr) + DSR_GUE6_LEN)

/* dsr_encap_gue: the outer header is IP, UDP to the GUE port and GUE, the
 * backend in GUE's private data. The UDP checksum is 0: allowed for IPv4,
 * and for IPv6 tunnels (RFC 6935; Linux's own FOU/GUE sends it so by
 * default); only the backend's node reads the packet, before its stack. */
static __always_inline int dsr_encap_gue(struct __ctx_buff *ctx, struct ns_pkt *p,
					 const struct ns_config *cfg, struct ct_scratch *s,
					 __u32 inner_len)
{
	const struct dsr_info *d = &s->dsr.info;
	struct dsr_gue *g;

	if (!p->v6) {
		g = &s->dsr.g4.gue;
		__builtin_memset(&s->dsr.g4, 0, sizeof(s->dsr.g4));
		s->dsr.g4.udp.source = dsr_gue_sport(d->hash);
		if (dsr_outer4(ctx, p, cfg, s, &s->dsr.g4.ip, sizeof(struct iphdr), IPPROTO_UDP,
			       inner_len + DSR_GUE4_HLEN))
			return -1;
		s->dsr.g4.ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&s->dsr.g4.ip,
							     sizeof(struct iphdr), 0));
		s->dsr.g4.udp.dest = cfg->dsr_gue_port;
		s->dsr.g4.udp.len = bpf_htons(inner_len + DSR_GUE4_HLEN - sizeof(struct iphdr));
		g->hlen = DSR_GUE4_LEN / 4 - 1;
		g->proto = IPPROTO_IPIP;
		__builtin_memcpy(g->addr, &d->backend.w[3], 4);
	} else {
		g = &s->dsr.g6.gue;
		__builtin_memset(&s->dsr.g6, 0, sizeof(s->dsr.g6));
		s->dsr.g6.udp.source = dsr_gue_sport(d->hash);
		dsr_outer6(cfg, s, &s->dsr.g6.ip, IPPROTO_UDP,
			   inner_len + DSR_GUE6_HLEN - sizeof(struct ipv6hdr));
		s->dsr.g6.udp.dest = cfg->dsr_gue_port;
		s->dsr.g6.udp.len = s->dsr.g6.ip.payload_len;
		g->hlen = DSR_GUE6_LEN / 4 - 1;
		g->proto = IPPROTO_IPV6;
		__builtin_memcpy(g->addr, d->backend.b, 16);
	}
	g->kind = bpf_htons(DSR_GUE_KIND);
	g->port = d->port;
	if (!p->v6) {
		if (ctx_push_udp(ctx, DSR_GUE4_HLEN, false) ||
		    ctx_store_bytes(ctx, p->l3_off, &s->dsr.g4, DSR_GUE4_HLEN))
			return -1;
	} else if (ctx_push_udp(ctx, DSR_GUE6_HLEN, true) ||
		   ctx_store_bytes(ctx, p->l3_off, &s->dsr.g6, DSR_GUE6_HLEN)) {
		return -1;
	}
	p->proto = IPPROTO_UDP;
	return 0;
}

/* dsr_encap wraps the packet of p in an outer header from this node's
 * address to the tunnel's end, naming the backend (the scratch's dsr_info:
 * node, backend, port; ns_dsr_forward fills it; the flow's hash goes
 * there too, for the IPv6 flow label and GUE's source port), GUE's or IPIP's as the
 * configuration says, and turns p into the outer packet's view (for the
 * FIB lookup). The header is built in the scratch, off the stack; a
 * function of its own, so that its locals stay out of the service path's
 * frame. */
static __noinline int dsr_encap(struct __ctx_buff *ctx, struct ns_pkt *p)
{
	const struct ns_config *cfg = ns_cfg();
	struct ct_scratch *s = ns_scratch();
	int ret;

	if (!cfg || !s || !p)
		return -1;
	s->dsr.info.hash = ns_flow_hash(p);
	if (dsr_gue_on(cfg))
		ret = dsr_encap_gue(ctx, p, cfg, s, ctx_len(ctx) - p->l3_off);
	else
		ret = dsr_encap_ipip(ctx, p, cfg, s, ctx_len(ctx) - p->l3_off);
	if (ret)
		return ret;
	p->saddr = *snat_conf_addr(cfg, p->v6);
	p->daddr = s->dsr.info.node;
	p->sport = p->dport = 0;
	return 0;
}

/* The outer header must fit the device's MTU as well. A packet that no
 * longer fits is answered the way a router on the path would answer it:
 * fragmentation needed (IPv4) or packet too big (IPv6), with the MTU less
 * the outer header, from the frontend the client used, out of the device
 * it came in on. The client lowers its path MTU and resends; TCP then never
 * sends a segment that does not fit. Cilium's DSR answers the same way.
 * IPv4 without DF too: a router would fragment it, BPF cannot, and Linux
 * takes the error all the same (udp_err lowers the path MTU), so a UDP
 * client's next datagrams come in fragments that fit. A later fragment is
 * dropped: it quotes no ports, so no client could tell what it is about. */
#define DSR_QUOTE_L4 8 /* bytes of the L4 header quoted, all RFC 792 asks */

static __always_inline __u32 dsr_ip_hlen(const struct ns_pkt *p)
{
	return p->v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
}

/* dsr_overhead is what the outer header adds, the backend's option (or
 * UDP and GUE) too. */
static __always_inline __u32 dsr_overhead(const struct ns_pkt *p, const struct ns_config *cfg)
{
	if (dsr_gue_on(cfg))
		return p->v6 ? DSR_GUE6_HLEN : DSR_GUE4_HLEN;
	return p->v6 ? sizeof(struct ipv6hdr) + sizeof(struct dsr_opt6) :
		       sizeof(struct iphdr) + sizeof(struct dsr_opt4);
}

/* dsr_mtu returns the MTU the client must use when the packet plus the outer
 * header (hlen bytes)
 * exceeds the MTU of the device p came in on, else 0: the guess when the
 * FIB does not know the tunnel's route (ns_dsr_forward). */
static __always_inline __u32 dsr_mtu(struct __ctx_buff *ctx, __u32 hlen)
{
	__u32 mtu = 0;

	if (bpf_check_mtu(ctx, 0, &mtu, hlen, 0) != BPF_MTU_CHK_RET_FRAG_NEEDED || mtu <= hlen)
		return 0;
	return mtu - hlen;
}

/* The ICMP header of the error: type, code, checksum, then the unused
 * word that carries the MTU. */
struct dsr_icmp {
	__u8    type;
	__u8    code;
	__sum16 check;
	__be32  mtu;
};

/* dsr_icmp_csum sums the ICMP message of len bytes at off (a constant per
 * family, for the verifier) onto seed. */
#define dsr_icmp_csum(ctx, off, len, seed) ({					void *__q = ctx_ptr(ctx, off, len);					__q ? bpf_csum_diff(NULL, 0, __q, len, seed) : -1;		})

/* ns_reply_icmp turns p (client -> frontend, untouched) into an ICMP error
 * about it, in place, and sends it back: "fragmentation needed" / "packet
 * too big" with mtu, or with mtu 0 "port unreachable" (a Service without
 * endpoints, as kube-proxy's REJECT answers). The error's IP and ICMP
 * headers go in front of p's own header, which becomes the quote (with
 * IPv6's fragment header and 8 bytes of L4 header), and the rest is cut
 * off. It is counted and reported as a drop for reason. */
static __always_inline int ns_reply_icmp(struct __ctx_buff *ctx, const struct ns_pkt *p,
					 __u32 mtu, __u32 reason)
{
	__u32 hlen = dsr_ip_hlen(p), icmp_off = p->l3_off + hlen;
	__u32 qhdr = p->l4_off - p->l3_off, body = ICMP_ERR_HLEN + qhdr + DSR_QUOTE_L4;
	__u8 eth[2 * ETH_ALEN] __align_stack_8;
	struct dsr_icmp h = {};
	bool fh = false;
	__s64 sum;

	/* Counted and reported as a drop: the packet goes no further. */
	sl_note_drop(p, reason, ctx_len(ctx), ctx_ifindex(ctx), SL_HOOK_THIS);
	if (!ns_has_l4(p))
		return CTX_ACT_DROP;
	/* Only an IP header without options or extension headers (but an
	 * IPv6 fragment header) is quoted whole by these fixed lengths. */
	if (qhdr != hlen) {
		if (!p->v6 || qhdr != hlen + sizeof(struct ipv6_frag))
			return CTX_ACT_DROP;
		fh = true;
	}
	/* The tail first: at tc cutting it ends a GSO packet's GSO state
	 * (the error is one packet), which growing the head of a GSO packet
	 * other than TCP is refused without. */
	if (ctx_load_bytes(ctx, 0, eth, sizeof(eth)) ||
	    ctx_set_len(ctx, p->l3_off + qhdr + DSR_QUOTE_L4) ||
	    ctx_grow_head(ctx, hlen + ICMP_ERR_HLEN))
		return CTX_ACT_DROP;
	/* Ethernet: back to where it came from. */
	if (ctx_store_bytes(ctx, 0, eth + ETH_ALEN, ETH_ALEN) ||
	    ctx_store_bytes(ctx, ETH_ALEN, eth, ETH_ALEN))
		return CTX_ACT_DROP;
	if (!p->v6) {
		struct iphdr ip4 = {
			.version = 4,
			.ihl = 5,
			.tot_len = bpf_htons(sizeof(struct iphdr) + ICMP_ERR_HLEN +
					     sizeof(struct iphdr) + DSR_QUOTE_L4),
			.frag_off = bpf_htons(DSR_IP4_DF),
			.ttl = IPIP_TTL,
			.protocol = IPPROTO_ICMP,
			.saddr = p->daddr.w[3],
			.daddr = p->saddr.w[3],
		};

		ip4.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&ip4, sizeof(ip4), 0));
		h.type = ICMP_DEST_UNREACH;
		h.code = mtu ? ICMP_FRAG_NEEDED : ICMP_PORT_UNREACH;
		h.mtu = bpf_htonl(mtu & 0xffff); /* unused (16 bits), next-hop MTU */
		if (ctx_store_bytes(ctx, p->l3_off, &ip4, sizeof(ip4)) ||
		    ctx_store_bytes(ctx, icmp_off, &h, sizeof(h)))
			return CTX_ACT_DROP;
		sum = dsr_icmp_csum(ctx, icmp_off,
				    ICMP_ERR_HLEN + sizeof(struct iphdr) + DSR_QUOTE_L4, 0);
	} else {
		struct ipv6hdr ip6 = {
			.version = 6,
			.payload_len = bpf_htons(body),
			.nexthdr = IPPROTO_ICMPV6,
			.hop_limit = IPIP_TTL,
		};

		__builtin_memcpy(&ip6.saddr, p->daddr.b, 16);
		__builtin_memcpy(&ip6.daddr, p->saddr.b, 16);
		if (mtu) {
			h.type = ICMPV6_PKT_TOOBIG;
			h.mtu = bpf_htonl(mtu);
		} else {
			h.type = ICMPV6_DEST_UNREACH;
			h.code = ICMPV6_PORT_UNREACH;
		}
		if (ctx_store_bytes(ctx, p->l3_off, &ip6, sizeof(ip6)) ||
		    ctx_store_bytes(ctx, icmp_off, &h, sizeof(h)))
			return CTX_ACT_DROP;
		/* The pseudo header: addresses, upper-layer length, next header. */
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ip6.saddr, 32,
				    bpf_htonl(body) + bpf_htonl(IPPROTO_ICMPV6));
		if (fh)
			sum = dsr_icmp_csum(ctx, icmp_off, ICMP_ERR_HLEN + sizeof(struct ipv6hdr) +
					    sizeof(struct ipv6_frag) + DSR_QUOTE_L4, sum);
		else
			sum = dsr_icmp_csum(ctx, icmp_off,
					    ICMP_ERR_HLEN + sizeof(struct ipv6hdr) + DSR_QUOTE_L4, sum);
	}
	if (sum < 0)
		return CTX_ACT_DROP;
	h.check = csum_fold(sum);
	if (ctx_store_bytes(ctx, icmp_off + offsetof(struct dsr_icmp, check), &h.check,
			    sizeof(h.check)))
		return CTX_ACT_DROP;
	return ctx_reply(ctx);
}

static __always_inline int dsr_reply_too_big(struct __ctx_buff *ctx, const struct ns_pkt *p,
					     __u32 mtu)
{
	return ns_reply_icmp(ctx, p, mtu, SL_DROP_TOO_BIG);
}

/* dsr_from_node: the outer source of p is a node of the cluster. The
 * agent records every other node's addresses as full-length prefixes
 * mapping to themselves (a backend's host prefix maps elsewhere), so one
 * exact LPM lookup answers. Tunnelled packets from anyone else are not
 * decapsulated here: they go to the stack, which drops them unless the
 * host has a tunnel of its own. */
static __always_inline bool dsr_from_node(const struct ns_pkt *p)
{
	struct tunnel_key key = { .prefixlen = 128 };
	struct tunnel_val *val;

	__builtin_memcpy(key.addr, p->saddr.b, sizeof(key.addr));
	val = bpf_map_lookup_elem(&ns_tunnel, &key);
	return val && addr_equal(&p->saddr, val->node_addr);
}

/* dsr_is_gue: p is UDP to this node's DSR GUE port (decapsulated in
 * every DSR mode, whichever dispatch this node sends with, so that nodes
 * can change --dsr-dispatch one at a time). */
static __always_inline bool dsr_is_gue(const struct ns_pkt *p, const struct ns_config *cfg)
{
	return p->proto == IPPROTO_UDP && cfg->dsr_gue_port && p->dport == cfg->dsr_gue_port;
}

/* dsr_is_tunnel: p is an IPIP / IP6IP6 packet (parse_ipv6 takes the
 * destination options of the IPv6 one) or a GUE one, to this node. */
static __always_inline bool dsr_is_tunnel(const struct ns_pkt *p, const struct ns_config *cfg)
{
	return (p->proto == (p->v6 ? IPPROTO_IPV6 : IPPROTO_IPIP) || dsr_is_gue(p, cfg)) &&
	       lb_is_node_addr(&p->daddr);
}

/* dsr_backend reads the backend the LB node named in the outer header of
 * p, if it did. */
static __always_inline void dsr_backend(struct __ctx_buff *ctx, const struct ns_pkt *p,
					struct ct_scratch *s, struct dsr_info *d)
{
	__u32 len = p->l4_off - p->l3_off;

	if (!p->v6) {
		struct dsr_opt4 *o = &s->dsr.h4.opt;

		if (len != sizeof(s->dsr.h4) ||
		    ctx_load_bytes(ctx, p->l3_off + sizeof(struct iphdr), o, sizeof(*o)) ||
		    o->type != DSR_OPT4_TYPE || o->len != sizeof(*o))
			return;
		addr_from_v4(&d->backend, o->addr);
		d->port = o->port;
	} else {
		struct dsr_opt6 *o = &s->dsr.h6.opt;

		if (len != sizeof(s->dsr.h6) ||
		    ctx_load_bytes(ctx, p->l3_off + sizeof(struct ipv6hdr), o, sizeof(*o)) ||
		    o->type != DSR_OPT6_TYPE || o->len != sizeof(o->port) + sizeof(o->addr))
			return;
		__builtin_memcpy(d->backend.b, o->addr, sizeof(o->addr));
		d->port = o->port;
	}
	d->has_backend = true;
}

/* dsr_gue_backend reads the backend from the GUE header after p's UDP
 * header; false when it is not sluice's (a GUE packet always names one). */
static __always_inline bool dsr_gue_backend(struct __ctx_buff *ctx, const struct ns_pkt *p,
					    struct ct_scratch *s, struct dsr_info *d)
{
	struct dsr_gue *g = &s->dsr.g6.gue;
	__u32 off = p->l4_off + sizeof(struct udphdr);

	if (!p->v6) {
		if (ctx_load_bytes(ctx, off, g, DSR_GUE4_LEN) ||
		    g->hlen != DSR_GUE4_LEN / 4 - 1 || g->proto != IPPROTO_IPIP)
			return false;
		addr_from_v4(&d->backend, *(__be32 *)g->addr);
	} else {
		if (ctx_load_bytes(ctx, off, g, DSR_GUE6_LEN) ||
		    g->hlen != DSR_GUE6_LEN / 4 - 1 || g->proto != IPPROTO_IPV6)
			return false;
		__builtin_memcpy(d->backend.b, g->addr, sizeof(g->addr));
	}
	if (g->flags || g->kind != bpf_htons(DSR_GUE_KIND))
		return false;
	d->port = g->port;
	d->has_backend = true;
	return true;
}

/* dsr_decap strips the outer header of p and parses the inner packet into
 * p; it returns the scratch's dsr_info: the sender (the LB node) and the
 * backend it chose, or NULL. */
static __always_inline struct dsr_info *dsr_decap(struct __ctx_buff *ctx, struct ns_pkt *p)
{
	__u32 len = p->l4_off - p->l3_off;
	struct ct_scratch *s = ns_scratch();
	struct dsr_info *d;

	if (!s)
		return NULL;
	d = &s->dsr.info;
	__builtin_memset(d, 0, sizeof(*d));
	d->node = p->saddr;
	if (p->proto == IPPROTO_UDP) {
		if (!dsr_gue_backend(ctx, p, s, d))
			return NULL;
		len += sizeof(struct udphdr) + (p->v6 ? DSR_GUE6_LEN : DSR_GUE4_LEN);
	} else {
		dsr_backend(ctx, p, s, d);
	}
	if (ctx_pop_l3(ctx, len) || parse_pkt(ctx, p) != PARSE_OK)
		return NULL;
	return d;
}

/* dsr_find_slot is dsr_find_named's loop body: slot i + 1 of the scratch's
 * key; *data, the backend ID, is set when the slot holds the named
 * backend on this node. Values only come back out of the loop (for the
 * verifier), the rest lives in the scratch. */
static long dsr_find_slot(__u32 i, void *data)
{
	struct ct_scratch *s = ns_scratch();
	const struct lb_backend *be;
	__u32 id = 0;

	if (!s)
		return 1;
	be = lb_backend_of_slot(&s->dsr.key, (__u16)(i + 1), &id);
	if (!be || be->port != s->dsr.info.port || !addr_equal(&s->dsr.info.backend, be->addr))
		return 0;
	if (be->flags & BE_F_LOCAL)
		*(__u32 *)data = id;
	return 1;
}

/* dsr_find_named finds, among the service's slots, the backend the LB
 * node named (d, the scratch's): every slot once (bpf_loop), for the
 * flow's first packet only. NULL when it is not there or not on this node
 * (it left the Service, or the nodes disagree for a moment). */
static __always_inline const struct lb_backend *
dsr_find_named(const struct lb_svc_key *key, const struct lb_svc_val *svc, __u32 *backend_id)
{
	struct ct_scratch *s = ns_scratch();
	__u32 id = 0;

	if (!s)
		return NULL;
	s->dsr.key = *key;
	bpf_loop(svc->count, dsr_find_slot, &id, 0);
	if (!id)
		return NULL;
	*backend_id = id;
	return bpf_map_lookup_elem(&lb_backends, &id);
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
