// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Destroys the connected UDP sockets of a network namespace whose backend
 * left the Service frontend the socket LB connected them through.
 *
 * The socket LB rewrites a UDP socket's connect() once: the socket then
 * sends to that backend for as long as it lives, where kube-proxy deletes
 * the flows' conntrack entries when an endpoint goes and the next datagram
 * is balanced again. An application whose socket is destroyed sees an
 * error (ECONNABORTED) and connects again, to a backend that serves. The
 * agent writes the (frontend, backend) pairs to sd_targets and reads this
 * iterator in each network namespace (bpf_iter__udp walks the reader's).
 *
 * bpf_sock_destroy is a kfunc of 6.5: this object is loaded apart from the
 * socket LB, and a kernel without it only loses this feature.
 */
#include "common.h"

#define TCP_ESTABLISHED 1 /* a connected UDP socket's state too */

/* The kernel's types, as far as read here; CO-RE finds the fields. */
struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct {
		__u8 u6_addr8[16];
	} skc_v6_daddr;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct inet_sock {
	struct sock sk;
} __attribute__((preserve_access_index));

struct udp_sock {
	struct inet_sock inet;
} __attribute__((preserve_access_index));

struct bpf_iter_meta {
	__u64 seq_num;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* The socket LB's map, handed in by the loader: (cookie, backend) -> the
 * frontend the socket asked for. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_sock_rev_key);
	__type(value, struct lb_sock_rev_val);
	__uint(max_entries, 1);
} lb_sock_rev SEC(".maps");

/* A frontend and a backend it lost. */
struct sd_target {
	__u8   frontend[16];
	__u8   backend[16];
	__be16 fport;
	__be16 bport;
	__u32  pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct sd_target);
	__type(value, __u8);
	__uint(max_entries, 4096);
} sd_targets SEC(".maps");

/* Sockets destroyed, ever (index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} sd_destroyed SEC(".maps");

SEC("iter/udp")
int sock_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct lb_sock_rev_key key = {};
	struct sd_target t = {};
	const struct lb_sock_rev_val *fe;
	struct udp_sock *udp = ctx->udp_sk;
	struct sock_common *sk;
	__u32 zero = 0;
	__u64 *n;

	if (!udp)
		return 0;
	sk = &udp->inet.sk.__sk_common;
	if (sk->skc_state != TCP_ESTABLISHED)
		return 0;
	if (sk->skc_family == AF_INET) {
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &sk->skc_daddr, 4);
	} else if (sk->skc_family == AF_INET6) {
		bpf_probe_read_kernel(key.addr, sizeof(key.addr), &sk->skc_v6_daddr);
	} else {
		return 0;
	}
	key.port = sk->skc_dport;
	key.cookie = bpf_get_socket_cookie(sk);
	fe = bpf_map_lookup_elem(&lb_sock_rev, &key);
	if (!fe)
		return 0; /* not connected through a Service */
	__builtin_memcpy(t.frontend, fe->addr, sizeof(t.frontend));
	__builtin_memcpy(t.backend, key.addr, sizeof(t.backend));
	t.fport = fe->port;
	t.bport = key.port;
	if (!bpf_map_lookup_elem(&sd_targets, &t)) {
		/* A NodePort's frontend is the family's wildcard (0.0.0.0 or
		 * ::) and the port; the socket asked for one node address (an
		 * IPv6 socket may have asked for a v4-mapped one). */
		if (addr_is_v4((const union lb_addr *)t.frontend))
			__builtin_memset(&t.frontend[12], 0, 4);
		else
			__builtin_memset(t.frontend, 0, sizeof(t.frontend));
		if (!bpf_map_lookup_elem(&sd_targets, &t))
			return 0;
	}
	if (bpf_sock_destroy(sk))
		return 0;
	n = bpf_map_lookup_elem(&sd_destroyed, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
