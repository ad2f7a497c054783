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

static __always_inline bool lb_is_node_addr(const union lb_addr *a)
{
	__u32 *flags = bpf_map_lookup_elem(&lb_node_ips, a->b);

	return flags && (*flags & LB_NODE_IP_LOCAL);
}

/* A NodePort answers on every address of this node and on loopback. */
static __always_inline bool lb_is_nodeport_addr(const union lb_addr *a)
{
	return addr_is_loopback(a) || lb_is_node_addr(a);
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

#endif /* __SLUICE_LB_H */
