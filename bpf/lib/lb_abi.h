/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The map ABI shared by every sluice load balancer program and the agent.
 *
 * Addresses are stored as 16-byte IPv6 addresses in network byte order; an
 * IPv4 address is stored IPv4-mapped (::ffff:a.b.c.d). One set of maps then
 * serves IPv4, IPv6 and IPv4-in-IPv6 sockets, and a connect6() to a mapped
 * address finds the IPv4 service without a second lookup path.
 * Ports are in network byte order; everything else is host byte order.
 *
 * Go mirrors these structs in internal/lbmap; a test checks that the sizes
 * and field offsets match the BTF of the compiled objects.
 */
#ifndef __SLUICE_LB_ABI_H
#define __SLUICE_LB_ABI_H

#include <linux/types.h>

#define LB_SCOPE_EXT 0 /* backends for traffic entering the node */
#define LB_SCOPE_INT 1 /* backends for traffic from this node (pods, host) */

/* Service flags, set on the master entry (slot 0). */
#define SVC_F_NODEPORT      (1 << 0)
#define SVC_F_EXTERNAL_IP   (1 << 1)
#define SVC_F_LOADBALANCER  (1 << 2)
#define SVC_F_AFFINITY      (1 << 3) /* sessionAffinity: ClientIP */
#define SVC_F_TWO_SCOPES    (1 << 4) /* an LB_SCOPE_INT master exists */
#define SVC_F_ETP_LOCAL     (1 << 5) /* externalTrafficPolicy: Local */
#define SVC_F_ITP_LOCAL     (1 << 6) /* internalTrafficPolicy: Local */
#define SVC_F_WILDCARD      (1 << 7) /* NodePort entry keyed by :: (any node IP, loopback) */
#define SVC_F_MAGLEV        (1 << 8) /* EXT backends chosen by the lb_maglev table */
#define SVC_F_SRC_RANGES    (1 << 9) /* loadBalancerSourceRanges: new flows only from lb_src_ranges */
#define SVC_F_HOSTPORT      (1 << 10) /* a Pod's hostPort on this node (its address or loopback) */

/* Backend flags. */
#define BE_F_TERMINATING (1 << 0) /* serving but terminating: fallback only */
#define BE_F_LOCAL       (1 << 1) /* runs on this node */

struct lb_svc_key {
	__u8  addr[16];  /* frontend address, v4-mapped for IPv4; :: for a wildcard NodePort */
	__be16 port;     /* frontend port */
	__u8  proto;     /* IPPROTO_TCP / IPPROTO_UDP */
	__u8  scope;     /* LB_SCOPE_* */
	__u16 slot;      /* 0 = master entry, 1..count = backend slots */
	__u16 pad;
};

struct lb_svc_val {
	__u32 backend_id;       /* slot > 0: the backend; master: 0 */
	__u16 count;            /* master: number of backend slots */
	__u16 rev_nat_id;       /* master and slots: reverse translation index */
	__u16 flags;            /* master: SVC_F_* */
	__u16 pad;
	__u32 affinity_timeout; /* master: seconds, when SVC_F_AFFINITY */
};

struct lb_backend {
	__u8  addr[16]; /* v4-mapped for IPv4 */
	__be16 port;
	__u8  proto;
	__u8  flags;    /* BE_F_* */
};

struct lb_rev_nat {
	__u8  addr[16]; /* the service frontend to restore */
	__be16 port;
	__u16 pad;
};

/* Socket-level reverse translation, for getpeername() and recvmsg(). */
struct lb_sock_rev_key {
	__u64 cookie;   /* socket cookie */
	__u8  addr[16]; /* backend address */
	__be16 port;    /* backend port */
	__u16 pad[3];
};

struct lb_sock_rev_val {
	__u8  addr[16]; /* service frontend address */
	__be16 port;
	__u16 rev_nat_id;
};

/* sessionAffinity: ClientIP. At the socket layer the client is the network
 * namespace (its cookie), as in Cilium. */
struct lb_affinity_key {
	__u64 client;     /* netns cookie */
	__u32 rev_nat_id;
	__u32 pad;
};

struct lb_affinity_val {
	__u32 backend_id;
	__u32 last_used;  /* seconds of CLOCK_BOOTTIME */
};

/* loadBalancerSourceRanges: an LPM trie key. prefixlen counts the bits
 * after it: LB_SRC_RANGE_STATIC_PREFIX for rev_nat_id and pad (always
 * matched in full), then the address bits (96 + n for an IPv4 /n, which
 * is stored v4-mapped). */
#define LB_SRC_RANGE_STATIC_PREFIX 32

struct lb_src_range_key {
	__u32 prefixlen;
	__u16 rev_nat_id;
	__u16 pad;
	__u8  addr[16]; /* v4-mapped for IPv4 */
};

/* Agent-written configuration, array index 0. */
struct lb_config {
	__u64 host_netns_cookie; /* the node's own namespace: bind protection applies there */
	__u32 flags;             /* LB_CFG_* */
	__u32 pad;
};

/* lb_config.flags */
/* The socket LB serves the node's own namespace only (a service mesh's
 * sidecars redirect pods' connections to the VIP with iptables and read
 * it back with SO_ORIGINAL_DST): pods' sockets keep the Service's address,
 * and the per-packet LB on their veths balances their packets. */
#define LB_CFG_HOSTNS_ONLY (1 << 0)

#endif /* __SLUICE_LB_ABI_H */
