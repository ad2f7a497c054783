/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Visibility: the events ring, drop counters and per-frontend and
 * per-backend counters (layouts in events_abi.h). Every object includes
 * this: the maps are pinned by name, so the socket LB, tc, XDP and pod
 * objects write one ring and one set of counters per node.
 *
 * Cost: counters are per-CPU and touched once per packet that leaves the
 * flow cache (whose own counters are added when its entry is flushed), and
 * once per new flow or socket-LB translation. An event costs nothing until
 * its flag is on (sl_ev_config): drops are on by default, the rest only
 * while `sluice monitor` asks; each CPU writes at most `rate` events a
 * second, and what it holds back is counted. */
#ifndef __SLUICE_EVENTS_H
#define __SLUICE_EVENTS_H

#include "common.h"
#include "events_abi.h"

/* The events, to the agent. max_entries (bytes, a power of two pages) is
 * set at load from --monitor-buffer-size. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct sl_ev_btf); /* a struct sl_ev_config */
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ev_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct sl_ev_rate);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_ev_rate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct sl_drop_count);
	__uint(max_entries, SL_DROP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_drops SEC(".maps");

/* sl_count_drop adds a dropped packet of len bytes (0: a refused
 * connect() or sendmsg(), no packet yet) to reason's counters. */
static __always_inline void sl_count_drop(__u32 reason, __u32 len)
{
	struct sl_drop_count *d = bpf_map_lookup_elem(&sl_drops, &reason);

	if (d) {
		d->packets++;
		d->bytes += len;
	}
}

/* rev_nat_id -> counters of that frontend; backend_id -> that backend's.
 * The agent deletes the entries of frontends and backends it removes. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);
	__type(value, struct sl_counters);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_fe_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__type(key, __u32);
	__type(value, struct sl_counters);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_be_stats SEC(".maps");

static __always_inline void sl_add(void *map, __u32 id, __u32 packets, __u32 bytes, __u32 conns)
{
	struct sl_counters *c = bpf_map_lookup_elem(map, &id);
	struct sl_counters n;

	if (c) {
		c->packets += packets;
		c->bytes += bytes;
		c->conns += conns;
		return;
	}
	n.packets = packets;
	n.bytes = bytes;
	n.conns = conns;
	/* Another program on this CPU cannot run between the lookup and
	 * the update; at worst another CPU's first packet wins the insert. */
	bpf_map_update_elem(map, &id, &n, BPF_NOEXIST);
}

/* sl_count adds to a frontend's and a backend's counters (an id of 0 is
 * none). A global function: verified once, whatever calls it. */
__noinline int sl_count(__u32 rev_nat_id, __u32 backend_id, __u32 packets, __u32 bytes,
			__u32 conns)
{
	if (rev_nat_id)
		sl_add(&sl_fe_stats, rev_nat_id, packets, bytes, conns);
	if (backend_id)
		sl_add(&sl_be_stats, backend_id, packets, bytes, conns);
	return 0;
}

/* sl_ev_wanted: events of flag f are on. An array lookup, inlined by the
 * verifier: cheap enough for a new flow's path. */
static __always_inline bool sl_ev_wanted(__u32 f)
{
	__u32 zero = 0;
	const struct sl_ev_config *c = bpf_map_lookup_elem(&sl_ev_config, &zero);

	return c && (c->flags & f);
}

/* sl_ev_reserve takes room for an event in the ring when this CPU is
 * within its rate this second; what it cannot send is counted. */
static __always_inline struct sl_event *sl_ev_reserve(void)
{
	__u32 zero = 0;
	const struct sl_ev_config *c = bpf_map_lookup_elem(&sl_ev_config, &zero);
	struct sl_ev_rate *r = bpf_map_lookup_elem(&sl_ev_rate, &zero);
	struct sl_event *ev;
	__u64 now, second;

	if (!c || !r)
		return NULL;
	/* jiffies cost a load where a clock read costs tens of ns: a flood
	 * of drops past the rate pays for the check alone. */
	if (c->hz) {
		now = bpf_jiffies64();
		second = c->hz;
	} else {
		now = bpf_ktime_get_ns();
		second = NSEC_PER_SEC;
	}
	if (now - r->start >= second) {
		r->start = now;
		r->sent = 0;
	}
	if (r->sent >= c->rate) {
		r->suppressed++;
		return NULL;
	}
	ev = bpf_ringbuf_reserve(&sl_events, sizeof(*ev), 0);
	if (!ev) {
		r->suppressed++;
		return NULL;
	}
	r->sent++;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ts = bpf_ktime_get_ns();
	return ev;
}

#endif /* __SLUICE_EVENTS_H */
