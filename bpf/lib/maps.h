/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The load balancer's maps. Layouts and byte order are in lb_abi.h: addresses
 * are 16 bytes (IPv4 v4-mapped), ports network order, the rest host order.
 * max_entries here are defaults; the agent sets them before load. All maps
 * are pinned by name so that state survives an agent restart.
 */
#ifndef __SLUICE_MAPS_H
#define __SLUICE_MAPS_H

#include "common.h"

/* Frontend (addr, port, proto, scope, slot) -> master entry or backend slot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc_val);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_services SEC(".maps");

/* Backend id (host order) -> backend address and port. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_backends SEC(".maps");

/* rev_nat_id (host order) -> the frontend a reply must appear to come from. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, struct lb_rev_nat);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_rev_nat SEC(".maps");

/* (socket cookie, backend) -> frontend, for getpeername() and recvmsg(). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_sock_rev_key);
	__type(value, struct lb_sock_rev_val);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_sock_rev SEC(".maps");

/* (client netns cookie, rev_nat_id) -> backend, for sessionAffinity. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity_val);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_affinity SEC(".maps");

/* Node address (16 bytes, network order) -> LB_NODE_IP_* flags: this
 * node's, or another node's of the cluster. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u8[16]);
	__type(value, __u32);
	/* Every Node's InternalIPs (5,000 Nodes, dual-stack) and this node's
	 * addresses; allocated per entry. */
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_node_ips SEC(".maps");

#define LB_NODE_IP_LOCAL  (1 << 0) /* this node's */
#define LB_NODE_IP_REMOTE (1 << 1) /* another node's */
#define LB_NODE_IP_NO_NODEPORT (1 << 2) /* NodePorts do not answer on it (--nodeport-addresses) */

/* The node addresses a NodePort is served on. East-west (the socket LB,
 * the per-packet pod LB) any node's: a pod's connection to another node's
 * NodePort is balanced where it starts, as Cilium's socket LB does. The
 * north-south programs set this node's alone (nodeport.h): a packet to
 * another node's address that passes through is that node's to serve;
 * serving it here would masquerade as that node. */
#ifndef LB_NODEPORT_NODES
#define LB_NODEPORT_NODES (LB_NODE_IP_LOCAL | LB_NODE_IP_REMOTE)
#endif /* LB_NODEPORT_NODES */

/* Agent configuration, one entry at index 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_config SEC(".maps");

/* loadBalancerSourceRanges of the frontends flagged SVC_F_SRC_RANGES:
 * {rev nat ID, client prefix} -> 1. Read by tc/XDP (new flows from
 * outside) and by the socket LB's egress check (the node's own and its
 * pods' connections). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lb_src_range_key);
	__type(value, __u8);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lb_src_ranges SEC(".maps");

/* lb_src_range_allowed reports whether addr (IPv6, or IPv4-mapped as
 * union lb_addr holds it) lies in one of the loadBalancerSourceRanges of
 * the frontend rev_nat_id. */
static __always_inline bool lb_src_range_allowed(const __u8 *addr, __u16 rev_nat_id)
{
	struct lb_src_range_key key __align_stack_8 = {
		.prefixlen  = LB_SRC_RANGE_STATIC_PREFIX + 128,
		.rev_nat_id = rev_nat_id,
	};

	__builtin_memcpy(key.addr, addr, sizeof(key.addr));
	return bpf_map_lookup_elem(&lb_src_ranges, &key) != NULL;
}

#endif /* __SLUICE_MAPS_H */
