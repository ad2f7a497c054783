// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket-level load balancing for Services (east-west traffic).
 *
 * connect() and sendmsg() to a Service frontend are rewritten to a backend
 * before the kernel routes anything, so no packet ever carries the VIP and no
 * per-packet NAT is needed. recvmsg() and getpeername() rewrite the backend
 * back to the frontend the application asked for. bind() in the node's own
 * namespace may not take a NodePort.
 *
 * Attached to a cgroup v2 sub-tree; the hooks apply to sockets created by
 * processes in it.
 */
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include "common.h"
#include "maps.h"
#include "lb.h"
#include "sock.h"
#include "events.h"

/* Rejects the syscall with -err. bpf_set_retval (5.18) replaces the -EPERM
 * the kernel would report for a bare SYS_REJECT.
 */
static __always_inline int sock_reject(int err)
{
	bpf_set_retval(-err);
	return SYS_REJECT;
}

/* sl_sock_event writes a socket-LB event: what (type | reason << 8), the
 * frontend dst:port (port in the low 16 bits of rev_port, network order,
 * its rev_nat_id above) and the backend chosen, with the socket's cgroup
 * and network namespace. */
static __noinline int sl_sock_event(struct bpf_sock_addr *ctx, const union lb_addr *dst,
				    __u32 what, __u32 rev_port, __u32 backend_id)
{
	struct sl_event *ev = sl_ev_reserve();
	const struct lb_backend *be;

	if (!ev)
		return 0;
	ev->type = what & 0xff;
	ev->reason = (what >> 8) & 0xff;
	ev->hook = SL_HOOK_SOCK;
	ev->proto = ctx->protocol;
	ev->rev_nat_id = rev_port >> 16;
	ev->backend_id = backend_id;
	__builtin_memcpy(ev->daddr, dst->b, sizeof(ev->daddr));
	ev->dport = rev_port & 0xffff;
	if (backend_id) {
		be = bpf_map_lookup_elem(&lb_backends, &backend_id);
		if (be) {
			__builtin_memcpy(ev->baddr, be->addr, sizeof(ev->baddr));
			ev->bport = be->port;
		}
	}
	ev->cgroup = bpf_get_current_cgroup_id();
	ev->netns = bpf_get_netns_cookie(ctx);
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

/* sl_sock_drop counts a refused connect() or sendmsg() and reports it. */
static __always_inline void sl_sock_drop(struct bpf_sock_addr *ctx, const union lb_addr *dst,
					 __be16 dport, __u16 rev_nat_id, __u32 reason)
{
	sl_count_drop(reason, 0);
	if (sl_ev_wanted(SL_EVF_DROP))
		sl_sock_event(ctx, dst, SL_EV_DROP | (reason << 8),
			      ((__u32)rev_nat_id << 16) | dport, 0);
}

/* A socket the socket LB translated to a frontend with
 * loadBalancerSourceRanges, and the backend it got: its packets to that
 * backend leave only from an address in the ranges (sock_src_egress).
 * connect() and sendmsg() do not know the source address the kernel will
 * pick for an unbound socket; the packet does. Storage that lives and dies
 * with the socket: nothing to evict, nothing to collect. */
struct sock_src_check {
	__u8   backend[16];
	__be16 backend_port;
	__u16  rev_nat_id;
	__u32  pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_src_check);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sock_src_checks SEC(".maps");

/* sock_src_check_arm marks the socket for the egress check: 0, or -1 when
 * the kernel could not store the mark (the caller refuses the syscall:
 * the ranges fail closed). */
static __noinline int sock_src_check_arm(struct bpf_sock_addr *ctx, const union lb_addr *backend,
					 __be16 backend_port, __u16 rev_nat_id)
{
	struct bpf_sock *sk = ctx->sk;
	struct sock_src_check *c;

	if (!sk || !backend)
		return -1;
	c = bpf_sk_storage_get(&sock_src_checks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!c)
		return -1;
	__builtin_memcpy(c->backend, backend->b, sizeof(c->backend));
	c->backend_port = backend_port;
	c->rev_nat_id = rev_nat_id;
	return 0;
}

/* __sock_xlate translates a connect() or sendmsg() destination dst to a
 * backend. v4 is a constant: the branches on it vanish at compile time, as
 * the verifier refuses user_ip4 in a v6 program and the reverse.
 */
static __always_inline int __sock_xlate(struct bpf_sock_addr *ctx,
					const union lb_addr *dst, const bool v4)
{
	struct lb_svc_key key __align_stack_8;
	union lb_addr backend __align_stack_8;
	const struct lb_svc_val *svc;
	const struct lb_backend *be;
	__be16 dport = sock_get_port(ctx);
	__u8 proto = ctx->protocol;
	__u64 cookie, client = 0;
	__u32 hash, backend_id = 0;

	if (!sock_proto_supported(proto) || !sock_served(ctx))
		return SYS_PROCEED;
	/* A pod's loopback is its own: only the node's namespace reaches
	 * NodePorts on 127.0.0.1 / ::1, as with kube-proxy.
	 */
	if (addr_is_loopback(dst) && !sock_is_host_netns(ctx))
		return SYS_PROCEED;
	lb_key_init(&key, dst, dport, proto);
	svc = lb_lookup_service(&key, LB_SCOPE_INT);
	if (!svc)
		return SYS_PROCEED;
	if (lb_remote_local_nodeport(dst, &key))
		return SYS_PROCEED; /* that node's to answer */
	/* Like kube-proxy's REJECT: fail at once rather than time out. */
	if (svc->count == 0) {
		sl_sock_drop(ctx, dst, dport, svc->rev_nat_id,
			     svc->flags & SVC_F_ITP_LOCAL ? SL_DROP_NO_LOCAL_BACKEND :
							    SL_DROP_NO_BACKEND);
		return sock_reject(ECONNREFUSED);
	}

	cookie = bpf_get_socket_cookie(ctx);
	/* A UDP socket has no connection to pin: hashing its cookie keeps
	 * all its datagrams on one backend.
	 */
	hash = proto == IPPROTO_UDP ? lb_hash64(cookie) : bpf_get_prandom_u32();
	if (svc->flags & SVC_F_AFFINITY)
		client = bpf_get_netns_cookie(ctx);
	be = lb_select_backend_id(&key, svc, hash, client, &backend_id);
	if (!be) {
		sl_sock_drop(ctx, dst, dport, svc->rev_nat_id, SL_DROP_NO_BACKEND);
		return sock_reject(EHOSTUNREACH); /* maps caught mid-update */
	}

	__builtin_memcpy(backend.b, be->addr, sizeof(backend.b));
	if (v4 && !addr_is_v4(&backend)) {
		sl_sock_drop(ctx, dst, dport, svc->rev_nat_id, SL_DROP_FAMILY);
		return sock_reject(EHOSTUNREACH);
	}
	if ((svc->flags & SVC_F_SRC_RANGES) &&
	    sock_src_check_arm(ctx, &backend, be->port, svc->rev_nat_id)) {
		sl_sock_drop(ctx, dst, dport, svc->rev_nat_id, SL_DROP_SRC_RANGE);
		return sock_reject(ENOBUFS);
	}
	sock_rev_record(cookie, &backend, be->port, dst, dport, svc->rev_nat_id);
	/* A connection, or an unconnected socket's datagram. */
	sl_count(svc->rev_nat_id, backend_id, 0, 0, 1);
	if (sl_ev_wanted(SL_EVF_SOCK))
		sl_sock_event(ctx, dst, SL_EV_SOCK, ((__u32)svc->rev_nat_id << 16) | dport,
			      backend_id);
	if (v4)
		sock4_set_addr(ctx, &backend);
	else
		sock6_set_addr(ctx, &backend);
	sock_set_port(ctx, be->port);
	return SYS_PROCEED;
}

/* __sock_rev_xlate shows the frontend instead of the backend peer. */
static __always_inline int __sock_rev_xlate(struct bpf_sock_addr *ctx,
					    const bool v4)
{
	union lb_addr peer __align_stack_8;
	union lb_addr front __align_stack_8;
	const struct lb_sock_rev_val *val;

	if (!sock_proto_supported(ctx->protocol) || !sock_served(ctx))
		return SYS_PROCEED;
	if (v4)
		sock4_get_addr(ctx, &peer);
	else
		sock6_get_addr(ctx, &peer);
	val = sock_rev_lookup(bpf_get_socket_cookie(ctx), &peer,
			      sock_get_port(ctx));
	if (!val)
		return SYS_PROCEED;
	__builtin_memcpy(front.b, val->addr, sizeof(front.b));
	if (v4)
		sock4_set_addr(ctx, &front);
	else
		sock6_set_addr(ctx, &front);
	sock_set_port(ctx, val->port);
	return SYS_PROCEED;
}

static __always_inline bool sock_nodeport_taken(union lb_addr *wild,
						__be16 port, __u8 proto)
{
	struct lb_svc_key key __align_stack_8;
	const struct lb_svc_val *svc;

	addr_to_wildcard(wild);
	lb_key_init(&key, wild, port, proto);
	svc = bpf_map_lookup_elem(&lb_services, &key);
	return svc && (svc->flags & SVC_F_NODEPORT);
}

/* __sock_bind keeps processes in the node's namespace off NodePorts: the
 * socket LB would send their would-be clients to the Service anyway.
 */
static __always_inline int __sock_bind(struct bpf_sock_addr *ctx,
				       union lb_addr *addr, const bool v4)
{
	__be16 port = sock_get_port(ctx);
	__u8 proto = ctx->protocol;
	bool any;

	if (!port || !sock_proto_supported(proto))
		return SYS_PROCEED;
	if (!sock_is_host_netns(ctx))
		return SYS_PROCEED;
	any = addr_is_any(addr);
	if (!any && !lb_is_nodeport_addr(addr))
		return SYS_PROCEED;
	if (sock_nodeport_taken(addr, port, proto))
		return sock_reject(EADDRINUSE);
	/* [::] of a dual-stack socket takes the IPv4 port as well. */
	if (!v4 && any) {
		addr_from_v4(addr, 0);
		if (sock_nodeport_taken(addr, port, proto))
			return sock_reject(EADDRINUSE);
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int sock4_connect(struct bpf_sock_addr *ctx)
{
	union lb_addr dst __align_stack_8;

	sock4_get_addr(ctx, &dst);
	return __sock_xlate(ctx, &dst, true);
}

SEC("cgroup/connect6")
int sock6_connect(struct bpf_sock_addr *ctx)
{
	union lb_addr dst __align_stack_8;

	sock6_get_addr(ctx, &dst);
	return __sock_xlate(ctx, &dst, false);
}

SEC("cgroup/sendmsg4")
int sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	union lb_addr dst __align_stack_8;

	sock4_get_addr(ctx, &dst);
	return __sock_xlate(ctx, &dst, true);
}

SEC("cgroup/sendmsg6")
int sock6_sendmsg(struct bpf_sock_addr *ctx)
{
	union lb_addr dst __align_stack_8;

	sock6_get_addr(ctx, &dst);
	return __sock_xlate(ctx, &dst, false);
}

SEC("cgroup/recvmsg4")
int sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	return __sock_rev_xlate(ctx, true);
}

SEC("cgroup/recvmsg6")
int sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	return __sock_rev_xlate(ctx, false);
}

SEC("cgroup/getpeername4")
int sock4_getpeername(struct bpf_sock_addr *ctx)
{
	return __sock_rev_xlate(ctx, true);
}

SEC("cgroup/getpeername6")
int sock6_getpeername(struct bpf_sock_addr *ctx)
{
	return __sock_rev_xlate(ctx, false);
}

SEC("cgroup/bind4")
int sock4_bind(struct bpf_sock_addr *ctx)
{
	union lb_addr addr __align_stack_8;

	sock4_get_addr(ctx, &addr);
	return __sock_bind(ctx, &addr, true);
}

SEC("cgroup/bind6")
int sock6_bind(struct bpf_sock_addr *ctx)
{
	union lb_addr addr __align_stack_8;

	sock6_get_addr(ctx, &addr);
	return __sock_bind(ctx, &addr, false);
}

/* sock_src_egress drops the packets of a socket sock_src_check_arm marked
 * that go to its backend from an address outside the frontend's
 * loadBalancerSourceRanges, as kube-proxy's firewall chain drops them
 * before DNAT: a TCP connect() then times out, a datagram is refused
 * (EPERM). Every other packet passes untouched: a socket without the mark
 * costs one storage lookup. */
SEC("cgroup_skb/egress")
int sock_src_egress(struct __sk_buff *skb)
{
	union lb_addr src __align_stack_8, dst __align_stack_8;
	const struct sock_src_check *c;
	struct bpf_sock *sk = skb->sk;
	__u32 l4 = 0, frag = 0;
	__be16 ports[2];
	__u8 proto;

	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1;
	c = bpf_sk_storage_get(&sock_src_checks, sk, 0, 0);
	if (!c)
		return 1;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)))
			return 1;
		addr_from_v4(&src, ip.saddr);
		addr_from_v4(&dst, ip.daddr);
		proto = ip.protocol;
		l4 = ip.ihl * 4;
		frag = ip.frag_off & bpf_htons(0x1fff) /* the fragment offset */;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)))
			return 1;
		__builtin_memcpy(src.b, &ip6.saddr, sizeof(src.b));
		__builtin_memcpy(dst.b, &ip6.daddr, sizeof(dst.b));
		proto = ip6.nexthdr; /* TCP or UDP straight after it, else no ports */
		l4 = sizeof(ip6);
	} else {
		return 1;
	}
	if (!addr_equal(&dst, c->backend))
		return 1;
	/* The port too where the packet has one: the socket may send to the
	 * backend's address on another port, not through the Service. */
	if (!frag && (proto == IPPROTO_TCP || proto == IPPROTO_UDP) &&
	    !bpf_skb_load_bytes(skb, l4, ports, sizeof(ports)) && ports[1] != c->backend_port)
		return 1;
	if (lb_src_range_allowed(src.b, c->rev_nat_id))
		return 1;
	sl_count_drop(SL_DROP_SRC_RANGE, skb->len);
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
