/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Parsing of Ethernet / IPv4 / IPv6 / TCP / UDP into struct ns_pkt, the
 * family-independent view that conntrack, NAT and the LB work on. */
#ifndef __SLUICE_L4_H
#define __SLUICE_L4_H

#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <stddef.h>

#include "ctx.h"
#include "frag.h"

/* ICMPv4 without <linux/icmp.h>: it pulls in libc's <sys/socket.h>
 * (through <linux/if.h>), which is not for the BPF target and needs the
 * i386 libc headers on x86-64. RFC 792. */
struct icmp4hdr {
	__u8	type;
	__u8	code;
	__sum16	checksum;
	__be32	rest; /* unused, or the next-hop MTU (RFC 1191) */
};

#define ICMP_DEST_UNREACH  3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_FRAG_NEEDED   4 /* code of ICMP_DEST_UNREACH */
#define ICMP_PORT_UNREACH  3 /* code of ICMP_DEST_UNREACH */

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* Byte 12 of the TCP header holds the data offset (header length in
 * words, high nibble), byte 13 the flags. */
#define TCP_DOFF_OFF  12
#define TCP_FLAGS_OFF 13

/* A DSR tunnel's IPv6 destination options header (struct dsr_opt6). */
#define NS_DSR_OPT6_LEN 24

struct ns_pkt {
	union lb_addr saddr;
	union lb_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8   proto;     /* L4 protocol */
	__u8   v6;        /* IPv6, else IPv4 */
	__u8   tcp_flags;
	__u8   frag;      /* NS_FRAG_*: part of a fragmented datagram */
	__u32  l3_off;
	__u32  l4_off;
};

/* ns_pkt.frag (frag.h): 0 for a whole datagram. */
#define NS_FRAG_FIRST 1 /* the first fragment, with the L4 header */
#define NS_FRAG_LATER 2 /* a later one: no L4 header; ports from ns_frag */

/* ns_has_l4: p carries its L4 header (not a later fragment), so ports and
 * the L4 checksum are in the packet. */
static __always_inline bool ns_has_l4(const struct ns_pkt *p)
{
	return p->frag != NS_FRAG_LATER;
}

/* An ICMP error and the packet it quotes (icmp.h). */
struct icmp_err {
	struct ns_pkt inner;   /* the quoted packet's tuple and offsets */
	__u32 csum_off;        /* the ICMP checksum */
	__u32 inner_l4_csum;   /* 0: the quoted L4 checksum is cut off or unused */
};

enum {
	PARSE_OK = 0,
	PARSE_SKIP,  /* not ours: hand to the stack */
	PARSE_DROP,  /* malformed */
};

static __always_inline __u32 l4_csum_off(const struct ns_pkt *p)
{
	switch (p->proto) {
	case IPPROTO_TCP:
		return p->l4_off + offsetof(struct tcphdr, check);
	case IPPROTO_UDP:
		return p->l4_off + offsetof(struct udphdr, check);
	case IPPROTO_ICMPV6:
		return p->l4_off + offsetof(struct icmp6hdr, icmp6_cksum);
	default: /* IPPROTO_ICMP: no pseudo header */
		return p->l4_off + offsetof(struct icmp4hdr, checksum);
	}
}

/* quoted: p is the packet quoted by an ICMP error, of which only the first
 * 8 bytes of L4 header are sure to be there. */
static __always_inline int parse_l4(struct __ctx_buff *ctx, struct ns_pkt *p, bool quoted)
{
	struct {
		__be16 sport;
		__be16 dport;
	} ports;
	__u8 flags;

	switch (p->proto) {
	case IPPROTO_TCP:
		if (quoted)
			goto ports;
		if (ctx_load_bytes(ctx, p->l4_off + TCP_FLAGS_OFF, &flags, 1))
			return PARSE_DROP;
		p->tcp_flags = flags;
		/* fall through */
	case IPPROTO_UDP:
ports:
		if (ctx_load_bytes(ctx, p->l4_off, &ports, sizeof(ports)))
			return PARSE_DROP;
		p->sport = ports.sport;
		p->dport = ports.dport;
		return PARSE_OK;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		return PARSE_OK;
	case IPPROTO_IPIP: /* DSR tunnels, no ports */
	case IPPROTO_IPV6:
		return quoted ? PARSE_SKIP : PARSE_OK;
	default:
		return PARSE_SKIP;
	}
}

/* parse_frag parses a fragment of a TCP or UDP datagram (p->frag set):
 * the first one's ports are kept, a later one's found (frag.h). */
static __always_inline int parse_frag(struct __ctx_buff *ctx, struct ns_pkt *p, __be32 id)
{
	bool first = p->frag == NS_FRAG_FIRST;
	int ret;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return PARSE_SKIP;
	if (first) {
		ret = parse_l4(ctx, p, false);
		if (ret != PARSE_OK)
			return ret;
	}
	if (frag_ports(&p->saddr, &p->daddr, id, p->proto, &p->sport, &p->dport, first))
		return PARSE_SKIP;
	return PARSE_OK;
}

/* ipv4_len_ok: the IPv4 header ip4 of p and its total length fit the
 * frame. A GSO packet at tc carries its whole length too; only IPv4 BIG
 * TCP (6.3, above 64 KiB) says 0, and takes the frame's. */
static __always_inline bool ipv4_len_ok(struct __ctx_buff *ctx, const struct ns_pkt *p,
					const struct iphdr *ip4)
{
	__u32 room = ctx_len(ctx) - p->l3_off, tot = bpf_ntohs(ip4->tot_len);

#ifdef SLUICE_TC
	if (!tot && ctx_field(ctx, gso_size))
		tot = room;
#endif /* SLUICE_TC */
	return tot >= ip4->ihl * 4 && tot <= room;
}

static __always_inline int parse_ipv4(struct __ctx_buff *ctx, struct ns_pkt *p, bool quoted)
{
	struct iphdr ip4;

	if (ctx_load_bytes(ctx, p->l3_off, &ip4, sizeof(ip4)))
		return PARSE_DROP;
	/* The Ethernet type's word is not the header's: a frame of type IPv4
	 * that says another version is the stack's to drop (ip_rcv). */
	if (ip4.version != 4)
		return PARSE_SKIP;
	if (ip4.ihl < 5)
		return PARSE_DROP;
	/* The lengths ip_rcv checks: the header inside the packet, the packet
	 * inside the frame (Ethernet padding may follow it). A quoted packet
	 * is cut short by its ICMP error: its header must be whole. */
	if (!quoted && !ipv4_len_ok(ctx, p, &ip4))
		return PARSE_DROP;
	if (quoted && p->l3_off + ip4.ihl * 4 > ctx_len(ctx))
		return PARSE_DROP;
	/* More fragments or an offset: a fragment. An ICMP error quoting
	 * one is left to the stack. */
	if (ip4.frag_off & bpf_htons(0x3fff)) {
		if (quoted)
			return PARSE_SKIP;
		p->frag = (ip4.frag_off & bpf_htons(0x1fff)) ? NS_FRAG_LATER : NS_FRAG_FIRST;
	}
	addr_from_v4(&p->saddr, ip4.saddr);
	addr_from_v4(&p->daddr, ip4.daddr);
	p->proto = ip4.protocol;
	p->v6 = 0;
	p->l4_off = p->l3_off + ip4.ihl * 4;
	if (p->frag)
		return parse_frag(ctx, p, ip4.id);
	return parse_l4(ctx, p, quoted);
}

/* The IPv6 fragment header (RFC 8200 4.5). */
struct ipv6_frag {
	__u8   nexthdr;
	__u8   reserved;
	__be16 frag_off; /* offset in 8-byte units << 3, M flag in bit 0 */
	__be32 id;
};

/* A hop-by-hop header of one jumbo payload option (RFC 2675): BIG TCP's. */
struct ipv6_jumbo {
	__u8   nexthdr;
	__u8   hdrlen; /* 0: 8 bytes */
	__u8   opt;    /* IPV6_TLV_JUMBO */
	__u8   optlen; /* 4 */
	__be32 payload_len; /* after the IPv6 header, this header included */
};

#ifndef IPV6_TLV_JUMBO
#define IPV6_TLV_JUMBO 0xc2
#endif

static __always_inline int parse_ipv6(struct __ctx_buff *ctx, struct ns_pkt *p, bool quoted)
{
	struct ipv6hdr ip6;

	if (ctx_load_bytes(ctx, p->l3_off, &ip6, sizeof(ip6)))
		return PARSE_DROP;
	if (ip6.version != 6)
		return PARSE_SKIP; /* ipv6_rcv's to drop */
	/* The payload inside the frame (a jumbogram's 0 has a hop-by-hop
	 * header, which the stack takes). A quoted packet is cut short. */
	if (!quoted && bpf_ntohs(ip6.payload_len) + sizeof(ip6) > ctx_len(ctx) - p->l3_off)
		return PARSE_DROP;
	/* Extension headers are left to the stack, as Cilium's fast path does
	 * for anything but the common case, a fragment header right after the
	 * IPv6 header, and BIG TCP's jumbo header (tc). */
	__builtin_memcpy(p->saddr.b, &ip6.saddr, 16);
	__builtin_memcpy(p->daddr.b, &ip6.daddr, 16);
	p->proto = ip6.nexthdr;
	p->v6 = 1;
	p->l4_off = p->l3_off + sizeof(ip6);
	/* A DSR tunnel's destination options (dsr.h), and only that: the
	 * header that names the backend, then the inner IPv6 packet. */
	if (ip6.nexthdr == 60 /* IPPROTO_DSTOPTS */ && !quoted) {
		__u8 dh[2]; /* next header, length in 8 bytes less the first 8 */

		if (ctx_load_bytes(ctx, p->l4_off, dh, sizeof(dh)))
			return PARSE_DROP;
		/* Of sluice's length only: the inner packet stays within
		 * CTX_PULL_LEN (nodeport.h), so tc reads what XDP reads. */
		if (dh[0] != IPPROTO_IPV6 || (dh[1] + 1) * 8 != NS_DSR_OPT6_LEN)
			return PARSE_SKIP;
		p->proto = IPPROTO_IPV6;
		p->l4_off += (dh[1] + 1) * 8;
		return PARSE_OK;
	}
#ifdef SLUICE_TC
	/* IPv6 BIG TCP (5.19+): GRO and a local stack's GSO make TCP
	 * aggregates over 64 KiB with a payload length of 0 and one hop-by-hop
	 * header holding only the jumbo payload option (RFC 2675), which the
	 * stack strips again before segmenting. That header, and only that
	 * one, is the flow's: the rest of the packet is translated as any
	 * other (its checksum's pseudo header has the TCP length, not this
	 * header's). XDP sees wire frames, never one. */
	if (ip6.nexthdr == 0 /* IPPROTO_HOPOPTS */ && !ip6.payload_len && !quoted) {
		struct ipv6_jumbo j;

		if (ctx_load_bytes(ctx, p->l4_off, &j, sizeof(j)))
			return PARSE_DROP;
		if (j.hdrlen || j.opt != IPV6_TLV_JUMBO || j.optlen != 4 || j.nexthdr != IPPROTO_TCP ||
		    bpf_ntohl(j.payload_len) + sizeof(ip6) != ctx_len(ctx) - p->l3_off)
			return PARSE_SKIP;
		p->proto = IPPROTO_TCP;
		p->l4_off += sizeof(j);
		return parse_l4(ctx, p, quoted);
	}
#endif /* SLUICE_TC */
	if (ip6.nexthdr == IPPROTO_FRAGMENT && !quoted) {
		struct ipv6_frag fh;

		if (ctx_load_bytes(ctx, p->l4_off, &fh, sizeof(fh)))
			return PARSE_DROP;
		p->proto = fh.nexthdr;
		p->l4_off += sizeof(fh);
		p->frag = (fh.frag_off & bpf_htons(0xfff8)) ? NS_FRAG_LATER : NS_FRAG_FIRST;
		return parse_frag(ctx, p, fh.id);
	}
	return parse_l4(ctx, p, quoted);
}

static __always_inline int parse_pkt(struct __ctx_buff *ctx, struct ns_pkt *p)
{
	__be16 proto;

	__builtin_memset(p, 0, sizeof(*p));
	if (ctx_load_bytes(ctx, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
		return PARSE_SKIP;
	p->l3_off = ETH_HLEN;
	switch (proto) {
	case bpf_htons(ETH_P_IP):
		return parse_ipv4(ctx, p, false);
	case bpf_htons(ETH_P_IPV6):
		return parse_ipv6(ctx, p, false);
	default:
		return PARSE_SKIP;
	}
}

#endif /* __SLUICE_L4_H */
