/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket-level load balancing: the translation done in connect()/sendmsg()
 * and its reversal in recvmsg()/getpeername(), over a struct bpf_sock_addr.
 */
#ifndef __SLUICE_SOCK_H
#define __SLUICE_SOCK_H

#include "common.h"
#include "maps.h"
#include "lb.h"

/* Verdicts of cgroup sock_addr programs. */
#define SYS_REJECT 0
#define SYS_PROCEED 1

static __always_inline void sock4_get_addr(const struct bpf_sock_addr *ctx,
					   union lb_addr *a)
{
	addr_from_v4(a, ctx->user_ip4);
}

static __always_inline void sock6_get_addr(const struct bpf_sock_addr *ctx,
					   union lb_addr *a)
{
	/* The context only allows 4-byte accesses to user_ip6. */
	a->w[0] = ctx->user_ip6[0];
	a->w[1] = ctx->user_ip6[1];
	a->w[2] = ctx->user_ip6[2];
	a->w[3] = ctx->user_ip6[3];
}

static __always_inline void sock4_set_addr(struct bpf_sock_addr *ctx,
					   const union lb_addr *a)
{
	ctx->user_ip4 = a->w[3];
}

static __always_inline void sock6_set_addr(struct bpf_sock_addr *ctx,
					   const union lb_addr *a)
{
	ctx->user_ip6[0] = a->w[0];
	ctx->user_ip6[1] = a->w[1];
	ctx->user_ip6[2] = a->w[2];
	ctx->user_ip6[3] = a->w[3];
}

/* user_port holds the network-order port in its low 16 bits. */
static __always_inline __be16 sock_get_port(const struct bpf_sock_addr *ctx)
{
	volatile __u32 port = ctx->user_port;

	return (__be16)port;
}

static __always_inline void sock_set_port(struct bpf_sock_addr *ctx, __be16 port)
{
	ctx->user_port = (__u32)port;
}

static __always_inline bool sock_proto_supported(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

/* sock_rev_record remembers which frontend a socket was translated from,
 * writing only when the entry differs.
 */
static __always_inline void sock_rev_record(__u64 cookie,
					    const union lb_addr *backend,
					    __be16 backend_port,
					    const union lb_addr *frontend,
					    __be16 frontend_port, __u16 rev_nat_id)
{
	struct lb_sock_rev_key key __align_stack_8 = {
		.cookie = cookie,
		.port = backend_port,
	};
	struct lb_sock_rev_val val __align_stack_8 = {
		.port = frontend_port,
		.rev_nat_id = rev_nat_id,
	};
	struct lb_sock_rev_val *old;

	__builtin_memcpy(key.addr, backend->b, sizeof(key.addr));
	__builtin_memcpy(val.addr, frontend->b, sizeof(val.addr));
	old = bpf_map_lookup_elem(&lb_sock_rev, &key);
	if (old && old->port == val.port && old->rev_nat_id == val.rev_nat_id &&
	    addr_equal(frontend, old->addr))
		return;
	bpf_map_update_elem(&lb_sock_rev, &key, &val, BPF_ANY);
}

/* A wildcard NodePort's rev NAT entry carries no address: any node address
 * or loopback the client used is a valid frontend.
 */
static __always_inline bool sock_rev_nat_matches(const struct lb_rev_nat *rn,
						 const struct lb_sock_rev_val *val)
{
	union lb_addr a __align_stack_8;

	if (rn->port != val->port)
		return false;
	__builtin_memcpy(a.b, rn->addr, sizeof(a.b));
	if (addr_equal(&a, val->addr))
		return true;
	return addr_is_any(&a);
}

/* sock_rev_lookup returns the frontend to show for a peer address of the
 * socket, or NULL. An entry whose service is gone or changed is deleted.
 */
static __always_inline const struct lb_sock_rev_val *
sock_rev_lookup(__u64 cookie, const union lb_addr *peer, __be16 peer_port)
{
	struct lb_sock_rev_key key __align_stack_8 = {
		.cookie = cookie,
		.port = peer_port,
	};
	const struct lb_sock_rev_val *val;
	const struct lb_rev_nat *rn;
	__u16 rev_nat_id;

	__builtin_memcpy(key.addr, peer->b, sizeof(key.addr));
	val = bpf_map_lookup_elem(&lb_sock_rev, &key);
	if (!val)
		return NULL;
	rev_nat_id = val->rev_nat_id;
	rn = bpf_map_lookup_elem(&lb_rev_nat, &rev_nat_id);
	if (!rn || !sock_rev_nat_matches(rn, val)) {
		bpf_map_delete_elem(&lb_sock_rev, &key);
		return NULL;
	}
	return val;
}

static __always_inline const struct lb_config *lb_get_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&lb_config, &zero);
}

/* sock_is_host_netns tells whether the socket lives in the node's own
 * network namespace, as configured by the agent.
 */
static __always_inline bool sock_is_host_netns(struct bpf_sock_addr *ctx)
{
	const struct lb_config *cfg = lb_get_config();

	return cfg && cfg->host_netns_cookie &&
	       bpf_get_netns_cookie(ctx) == cfg->host_netns_cookie;
}

/* sock_served: the socket LB translates this socket's addresses. All
 * sockets of the cgroup it is attached to, or with LB_CFG_HOSTNS_ONLY the
 * node's own namespace's only. */
static __always_inline bool sock_served(struct bpf_sock_addr *ctx)
{
	const struct lb_config *cfg = lb_get_config();

	if (!cfg || !(cfg->flags & LB_CFG_HOSTNS_ONLY))
		return true;
	return cfg->host_netns_cookie && bpf_get_netns_cookie(ctx) == cfg->host_netns_cookie;
}

#endif /* __SLUICE_SOCK_H */
