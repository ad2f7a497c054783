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

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

/* Byte 12 of the TCP header holds the data offset (header length in
 * words, high nibble), byte 13 the flags. */
#define TCP_DOFF_OFF  12
#define TCP_FLAGS_OFF 13

struct ns_pkt {
	union lb_addr saddr;
	union lb_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8   proto;     /* L4 protocol */
	__u8   v6;        /* IPv6, else IPv4 */
	__u8   tcp_flags;
	__u8   pad;
	__u32  l3_off;
	__u32  l4_off;
};

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

static __always_inline int parse_ipv4(struct __ctx_buff *ctx, struct ns_pkt *p, bool quoted)
{
	struct iphdr ip4;

	if (ctx_load_bytes(ctx, p->l3_off, &ip4, sizeof(ip4)))
		return PARSE_DROP;
	if (ip4.ihl < 5)
		return PARSE_DROP;
	/* Later fragments carry no ports; the stack reassembles them. */
	if (ip4.frag_off & bpf_htons(0x3fff))
		return PARSE_SKIP;
	addr_from_v4(&p->saddr, ip4.saddr);
	addr_from_v4(&p->daddr, ip4.daddr);
	p->proto = ip4.protocol;
	p->v6 = 0;
	p->l4_off = p->l3_off + ip4.ihl * 4;
	return parse_l4(ctx, p, quoted);
}

static __always_inline int parse_ipv6(struct __ctx_buff *ctx, struct ns_pkt *p, bool quoted)
{
	struct ipv6hdr ip6;

	if (ctx_load_bytes(ctx, p->l3_off, &ip6, sizeof(ip6)))
		return PARSE_DROP;
	/* Extension headers are left to the stack, as Cilium's fast path does
	 * for anything but the common case. */
	__builtin_memcpy(p->saddr.b, &ip6.saddr, 16);
	__builtin_memcpy(p->daddr.b, &ip6.daddr, 16);
	p->proto = ip6.nexthdr;
	p->v6 = 1;
	p->l4_off = p->l3_off + sizeof(ip6);
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
