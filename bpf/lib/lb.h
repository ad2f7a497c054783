/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service lookup and backend selection, shared by every attach point.
 *
 * Nothing here touches a program context: callers pass the frontend, the
 * scope they serve, a client identity for affinity and a hash or random
 * number for the slot, so the socket, tc and XDP programs share one path.
 */
#ifndef __SLUICE_LB_H
#define __SLUICE_LB_H

#include "common.h"
#include "maps.h"

static __always_inline __u32 lb_now_sec(void)
{
	return bpf_ktime_get_boot_ns() / NSEC_PER_SEC;
}

/* murmur3's finalizer: spreads sequential socket cookies over the slots. */
static __always_inline __u32 lb_hash64(__u64 v)
{
	return hash_fmix32((__u32)v ^ (__u32)(v >> 32));
}

static __always_inline bool lb_node_addr_has(const union lb_addr *a, __u32 want)
{
	__u32 *flags = bpf_map_lookup_elem(&lb_node_ips, a->b);

	return flags && (*flags & want);
}

/* lb_is_node_addr: a is an address of this node. */
static __always_inline bool lb_is_node_addr(const union lb_addr *a)
{
	return lb_node_addr_has(a, LB_NODE_IP_LOCAL);
}

/* A NodePort answers on the node addresses of LB_NODEPORT_NODES (maps.h)
 * but those --nodeport-addresses leaves out, and, to the node's own
 * sockets (the socket LB), on loopback. Never on loopback from the wire
 * (tc, XDP): a neighbour sending to 127.0.0.1 would reach NodePorts that
 * --nodeport-addresses keeps from it (CVE-2020-8558's class; ns_martian
 * drops such packets first). */
static __always_inline bool lb_is_nodeport_addr(const union lb_addr *a)
{
	__u32 *flags;

#if !defined(SLUICE_TC) && !defined(SLUICE_XDP)
	if (addr_is_loopback(a))
		return true;
#endif
	flags = bpf_map_lookup_elem(&lb_node_ips, a->b);
	return flags && (*flags & LB_NODEPORT_NODES) && !(*flags & LB_NODE_IP_NO_NODEPORT);
}

static __always_inline void lb_key_init(struct lb_svc_key *key,
					const union lb_addr *addr,
					__be16 port, __u8 proto)
{
	__builtin_memcpy(key->addr, addr->b, sizeof(key->addr));
	key->port = port;
	key->proto = proto;
	key->scope = LB_SCOPE_EXT;
	key->slot = 0;
	key->pad = 0;
}

/* lb_lookup_service finds the master entry for key (addr, port and proto
 * set). A miss on a node address or loopback falls back to the wildcard
 * NodePort entry. scope is the scope the caller serves: LB_SCOPE_INT
 * switches to the internal master when the service has two. On return key
 * is the master's key, ready for lb_select_backend.
 */
static __always_inline const struct lb_svc_val *
lb_lookup_service(struct lb_svc_key *key, __u8 scope)
{
	const struct lb_svc_val *svc;

	svc = bpf_map_lookup_elem(&lb_services, key);
	if (!svc) {
		union lb_addr a __align_stack_8;

		__builtin_memcpy(a.b, key->addr, sizeof(a.b));
		if (!lb_is_nodeport_addr(&a))
			return NULL;
		addr_to_wildcard(&a);
		__builtin_memcpy(key->addr, a.b, sizeof(key->addr));
		svc = bpf_map_lookup_elem(&lb_services, key);
		if (!svc)
			return NULL;
	}
	if (scope == LB_SCOPE_INT && (svc->flags & SVC_F_TWO_SCOPES)) {
		key->scope = LB_SCOPE_INT;
		svc = bpf_map_lookup_elem(&lb_services, key);
	}
	return svc;
}

/* lb_remote_local_nodeport: key (from lb_lookup_service for dst) is the
 * wildcard NodePort answering for another node's address dst, with
 * externalTrafficPolicy Local. That node answers it, with its own
 * endpoints or none, as with kube-proxy: it DNATs its own addresses only,
 * and the other node sees traffic from outside. The socket LB and the
 * pods' per-packet LB leave it untranslated. */
static __always_inline bool lb_remote_local_nodeport(const union lb_addr *dst, struct lb_svc_key *key)
{
	const struct lb_svc_val *ext;
	__u8 scope = key->scope;

	if (addr_equal(dst, key->addr) || addr_is_loopback(dst) || lb_is_node_addr(dst))
		return false;
	key->scope = LB_SCOPE_EXT;
	ext = bpf_map_lookup_elem(&lb_services, key);
	key->scope = scope;
	return ext && (ext->flags & SVC_F_ETP_LOCAL);
}

static __always_inline const struct lb_backend *
lb_backend_of_slot(struct lb_svc_key *key, __u16 slot, __u32 *backend_id)
{
	const struct lb_svc_val *val;

	key->slot = slot;
	val = bpf_map_lookup_elem(&lb_services, key);
	key->slot = 0;
	if (!val)
		return NULL;
	*backend_id = val->backend_id;
	return bpf_map_lookup_elem(&lb_backends, &val->backend_id);
}

/* lb_affinity_backend returns the backend client used last for this
 * service, if that was within the timeout and the backend still exists.
 */
static __always_inline const struct lb_backend *
lb_affinity_backend(const struct lb_svc_val *svc, __u64 client, __u32 now,
		    __u32 *backend_id)
{
	struct lb_affinity_key key = {
		.client = client,
		.rev_nat_id = svc->rev_nat_id,
	};
	struct lb_affinity_val *val;
	const struct lb_backend *be;

	val = bpf_map_lookup_elem(&lb_affinity, &key);
	if (!val || now - val->last_used > svc->affinity_timeout)
		return NULL;
	be = bpf_map_lookup_elem(&lb_backends, &val->backend_id);
	if (!be)
		return NULL;
	/* Once a second at most: no map write while the value is unchanged. */
	if (val->last_used != now)
		WRITE_ONCE(val->last_used, now);
	*backend_id = val->backend_id;
	return be;
}

static __always_inline void
lb_affinity_store(const struct lb_svc_val *svc, __u64 client, __u32 now,
		  __u32 backend_id)
{
	struct lb_affinity_key key = {
		.client = client,
		.rev_nat_id = svc->rev_nat_id,
	};
	struct lb_affinity_val val = {
		.backend_id = backend_id,
		.last_used = now,
	};

	bpf_map_update_elem(&lb_affinity, &key, &val, BPF_ANY);
}

/* lb_select_backend_id picks the backend for a new flow of the service
 * whose master is svc (key from lb_lookup_service, svc->count > 0). hash
 * chooses the slot; client identifies the client for sessionAffinity. The
 * backend's ID goes to *backend_id, for the tc/XDP conntrack.
 */
static __always_inline const struct lb_backend *
lb_select_backend_id(struct lb_svc_key *key, const struct lb_svc_val *svc,
		     __u32 hash, __u64 client, __u32 *backend_id)
{
	const struct lb_backend *be;
	__u32 now = 0;

	if (svc->flags & SVC_F_AFFINITY) {
		now = lb_now_sec();
		be = lb_affinity_backend(svc, client, now, backend_id);
		if (be)
			return be;
	}
	be = lb_backend_of_slot(key, (__u16)(hash % svc->count) + 1, backend_id);
	if (be && (svc->flags & SVC_F_AFFINITY))
		lb_affinity_store(svc, client, now, *backend_id);
	return be;
}

static __always_inline const struct lb_backend *
lb_select_backend(struct lb_svc_key *key, const struct lb_svc_val *svc,
		  __u32 hash, __u64 client)
{
	__u32 backend_id = 0;

	return lb_select_backend_id(key, svc, hash, client, &backend_id);
}

#if defined(SLUICE_TC) || defined(SLUICE_XDP)
/* North-south selection (tc, XDP, the per-packet pod LB): the frontends a
 * program serves, the flow's hash and client identity, Maglev and source
 * ranges for a new flow, and the CT entry that decides an established one.
 * Sending is nodeport.h's. */
#include "ct.h"
#include "maglev.h"

#ifdef SLUICE_POD_LB
/* Pods reach every frontend, as through the socket LB. */
#define NS_SCOPE LB_SCOPE_INT
#define ns_svc_served(svc) true
#else
/* Frontends served here; a ClusterIP is for traffic from this node's pods. */
#define NS_SVC_FLAGS (SVC_F_NODEPORT | SVC_F_EXTERNAL_IP | SVC_F_LOADBALANCER | SVC_F_HOSTPORT)
#define NS_SCOPE LB_SCOPE_EXT
#define ns_svc_served(svc) ((svc)->flags & NS_SVC_FLAGS)
#endif /* SLUICE_POD_LB */

/* ns_flow_hash hashes p's 5-tuple, keyed with ns_config's hash_key (per
 * boot): the backend slot and first nat port of a new flow follow from
 * it, so a client that could compute it would choose source ports that
 * all land on one backend, or one nat port. */
static __always_inline __u32 ns_flow_hash(const struct ns_pkt *p)
{
	const struct ns_config *cfg = ns_cfg();
	__u32 h = hash_fmix32(p->proto ^ (cfg ? cfg->hash_key : 0));
	int i;

#pragma unroll
	for (i = 0; i < 4; i++) {
		h = lb_hash64(((__u64)h << 32) | p->saddr.w[i]);
		h = lb_hash64(((__u64)h << 32) | p->daddr.w[i]);
	}
	return lb_hash64(((__u64)h << 32) | ((__u32)p->sport << 16) | p->dport);
}

#ifndef SLUICE_POD_LB
/* ns_maglev_backend_id returns the backend of the frontend's Maglev table
 * for a flow, so that a flow entering any node for the same frontend
 * reaches the same backend; 0 when the frontend has no table yet (the
 * caller then uses the slots). A function of its own: the hash's values
 * and spills stay out of the service path's frame, and the call adds one
 * small frame to the chain (32 bytes by 6.1's rule: ns_maps.h). */
static __noinline __u32 ns_maglev_backend_id(const struct ns_pkt *p, __u16 rev_nat_id)
{
	return lb_maglev_backend(rev_nat_id,
				 lb_maglev_flow_hash(&p->saddr, &p->daddr, p->sport,
						     p->dport, p->proto));
}

#endif /* SLUICE_POD_LB */

/* ns_src_range_allowed reports whether a new flow's client lies in one of
 * the frontend's loadBalancerSourceRanges: north-south, and for local
 * pods through the per-packet LB, as kube-proxy's KUBE-FW chain drops them
 * whatever their source. Not inlined, like ns_maglev_backend_id: the key
 * lives in this small frame, not in the service path's. */
static __noinline bool ns_src_range_allowed(const struct ns_pkt *p, __u16 rev_nat_id)
{
	return lb_src_range_allowed(p->saddr.b, rev_nat_id);
}

#ifndef SLUICE_POD_LB
/* ns_v4_martian: a's IPv4 address (host order) is in 0.0.0.0/8 or
 * 127.0.0.0/8. */
static __always_inline bool ns_v4_martian(__u32 a)
{
	return (a >> 24) == 0 || (a >> 24) == 127;
}

/* ns_v4_group: a (host order) is multicast (224.0.0.0/4) or the limited
 * broadcast. */
static __always_inline bool ns_v4_group(__u32 a)
{
	return (a >> 28) == 0xe || a == 0xffffffff;
}

/* ns_martian: a packet from the wire that no frontend may serve, dropped
 * before any lookup, as the kernel drops it (ip_route_input's martians,
 * ipv6_rcv's checks): loopback or 0.0.0.0/8 (::, ::1) on either side, a
 * v4-mapped address in an IPv6 header, a multicast or broadcast source;
 * and TCP to a multicast or broadcast address (tcp_v4_rcv takes only its
 * host's). UDP to a group (DHCP, mDNS, a node's own use) and link-local
 * destinations pass untouched: no frontend is ever one (the apiserver
 * refuses them as external and load balancer IPs, and a NodePort answers on
 * node addresses only), so they never reach a Service. */
static __always_inline bool ns_martian(const struct ns_pkt *p)
{
	if (!p->v6) {
		__u32 d = bpf_ntohl(p->daddr.w[3]), s = bpf_ntohl(p->saddr.w[3]);

		/* 0.0.0.0 to the broadcast is a DHCP client's. */
		if (ns_v4_martian(d) || (ns_v4_martian(s) && !(s == 0 && d == 0xffffffff)) ||
		    ns_v4_group(s))
			return true;
		return p->proto == IPPROTO_TCP && ns_v4_group(d);
	}
	if (addr_is_v4(&p->daddr) || addr_is_v4(&p->saddr) || addr_is_any(&p->daddr) ||
	    addr_is_loopback(&p->daddr) || addr_is_loopback(&p->saddr) ||
	    p->saddr.b[0] == 0xff)
		return true;
	return p->proto == IPPROTO_TCP && p->daddr.b[0] == 0xff;
}
#endif /* SLUICE_POD_LB */

/* The client identity for sessionAffinity: its address. Bit 63 keeps it
 * apart from the netns cookies the socket LB stores in lb_affinity. */
static __always_inline __u64 ns_client_id(const struct ns_pkt *p)
{
	return (1ULL << 63) | ((__u64)(p->saddr.w[0] ^ p->saddr.w[1] ^ p->saddr.w[2]) << 32) |
	       p->saddr.w[3];
}

/* ns_flow_alive: the frontend and the backend a CT service entry names are
 * still installed. A deleted frontend loses its rev nat entry (the
 * reconciler deletes it after the master), a deleted backend its
 * lb_backends entry; an ID reused since names another address. Two small
 * lookups instead of the service master, its wildcard and a slot. */
static __always_inline bool ns_flow_alive(const struct ct_entry *e, const struct ns_pkt *p)
{
	const struct lb_rev_nat *rn;
	const struct lb_backend *be;
	__u32 backend_id = e->backend_id;
	__u16 rev_nat_id = e->rev_nat_id;
	union lb_addr any __align_stack_8;

	rn = bpf_map_lookup_elem(&lb_rev_nat, &rev_nat_id);
	if (!rn || rn->port != p->dport)
		return false;
	if (!addr_equal(&p->daddr, rn->addr)) {
		any = p->daddr;
		addr_to_wildcard(&any);
		if (!addr_equal(&any, rn->addr))
			return false;
	}
	be = bpf_map_lookup_elem(&lb_backends, &backend_id);
	return be && be->port == e->nat_port && addr_equal((const union lb_addr *)e->nat_addr, be->addr);
}

/* ns_flow_kept: an established TCP flow keeps its backend when the backend
 * or the frontend is removed, as kube-proxy's conntrack keeps it: the
 * connection goes on while the pod answers (and ends as it would, with a
 * FIN, a RST or the client's timeout), instead of being rehashed to
 * another backend, which would answer it with a RST. Its CT entry holds
 * all the translation needs. UDP and other flows, and TCP flows still in
 * their handshake, follow the change: kube-proxy flushes UDP conntrack
 * entries of a removed endpoint. */
static __always_inline bool ns_flow_kept(const struct ct_entry *e, __u8 proto)
{
	return proto == IPPROTO_TCP && (e->flags & (CT_F_ESTABLISHED | CT_F_NEW)) == CT_F_ESTABLISHED;
}

/* ns_established looks up the CT service entry of p and returns it when it
 * still decides the flow: alive (or kept, ns_flow_kept), not a SYN reusing
 * a closing tuple, and, for SNAT, with its nat port: copied into the entry
 * (ct_snat_copy), or else its egress mapping in *n. Then the entry holds all
 * that the translation needs, and no service, slot or backend entry is
 * read. Whether the flow is alive is checked by the first packet in each
 * CT second (alive_at): a deleted backend or frontend stops taking a UDP
 * flow's packets within a second, as the agent's own updates land. */
static __always_inline struct ct_entry *ns_established(const struct ns_pkt *p, __u32 now,
							const struct nat_entry **n)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_tuple *t;
	struct ct_entry *e;

	/* The key in the scratch, not the stack: precisely tracked stack
	 * slots cost the verifier ~20% more states on this path. */
	if (!s)
		return NULL;
	t = &s->tuple;
	ct_tuple_set(t, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	e = (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN ? ct_lookup_syn(t) : ct_lookup(t);
	s->ct_absent = !e;
	if (!e || ct_is_new_syn(e, p->proto, p->tcp_flags, now))
		return NULL;
	if (READ_ONCE(e->alive_at) != now) {
		if (!ns_flow_kept(e, p->proto) && !ns_flow_alive(e, p))
			return NULL;
		WRITE_ONCE(e->alive_at, now);
	}
	*n = NULL;
	if ((e->flags & (CT_F_LOCAL | CT_F_DSR)) || ct_snat_copy(e))
		return e;
	/* The egress mapping's key is the tuple after DNAT. */
	__builtin_memcpy(t->daddr, e->nat_addr, sizeof(t->daddr));
	t->sport = ct_client_port(e, p->sport);
	t->dport = e->nat_port;
	t->dir = NAT_DIR_EGRESS;
	*n = snat_lookup(t);
	return *n ? e : NULL;
}
#endif /* SLUICE_TC || SLUICE_XDP */

#endif /* __SLUICE_LB_H */
