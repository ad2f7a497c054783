/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A per-CPU exact-match cache of established masqueraded flows, in front
 * of conntrack.
 *
 *   packet ──▶ fc_lookup (hash of the tuple, one set of NS_FLOW_WAYS)
 *                │ hit, this CT second: rewrite, counters, send (kept MACs)
 *                └ miss: conntrack path ──▶ fc_fill (after a FIB result
 *                                           kept in the flow's CT entry)
 *
 * Why: a hash map lookup is a helper call; the CT key is hashed (jhash of
 * 40 bytes), its bucket walked, and the call returns through the return
 * thunk of a kernel with SRSO / retbleed mitigations. In the live NodePort
 * path that was ~70% of xdp_lb_ingress's cost. An array lookup is inlined
 * by the verifier (per-CPU arrays since 6.10; a helper call before), and
 * the key is compared in place.
 *
 * What an entry holds is a copy of what the flow's CT entries decided in
 * this CT second, and it is trusted only in that second: the same rule as
 * the FIB result kept in a CT entry (ct_fib) and the check that a flow's
 * frontend and backend are still installed (alive_at), which the first
 * packet of each second runs on the conntrack path. A packet that could
 * change the flow's CT state (TCP SYN, FIN, RST) never takes an entry, and
 * entries are filled only for flows in a state that plain packets do not
 * change (UDP; TCP established; a reply once one has been seen), so the CT
 * entry would be written by none of the packets the cache takes: only its
 * counters, which the entry keeps (packets, bytes) and gives to the CT
 * entry when it is filled again or taken over; the agent adds what is
 * still held when it dumps the ct map (lbmap.CT).
 *
 * Per CPU, so no atomics on the hot path: a program runs to the end on its
 * CPU (softirq, or with BH disabled), and a flow's packets arrive on one.
 *
 * Memory: a hit reads one cache line of the cache for an IPv4 packet (two
 * for IPv6), and nothing else that is not read for every packet. The map
 * is a plain array, CPU-major (cpu << fc_set_bits | set), mmapable so that
 * its values start on a page and each set, whose size is a multiple of 64
 * bytes, on a cache line. A per-CPU array would put each set on its own
 * allocation, aligned to 8 bytes, behind a table of pointers read first:
 * with 1,024 flows, the two or three lines of an entry and a pointer's
 * line were missed in cache at almost every packet (the first comparison
 * took a quarter of xdp_lb_ingress's samples).
 */
#ifndef __SLUICE_FLOWCACHE_H
#define __SLUICE_FLOWCACHE_H

#include "ct.h"

/* CPU and set (hash of the tuple) -> NS_FLOW_WAYS entries; the agent sizes
 * it to 1 << fc_set_bits sets for each possible CPU before load
 * (--bpf-lb-flow-cache-sets). Not pinned: it is derived state, rebuilt by
 * the first packet of each flow in each CT second; a restarted agent
 * starts with an empty one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct ns_flow_set);
	__uint(max_entries, NS_FLOW_SETS);
} ns_flow_cache SEC(".maps");

_Static_assert(sizeof(struct ns_flow) == 128 && offsetof(struct ns_flow, saddr_hi) == 64,
	       "struct ns_flow: a hit's line, then the addresses' line");

/* log2 of the sets, 1 to 16, set by the agent before load; 0 turns the
 * cache off, and the verifier, which knows a read-only global's value,
 * then drops its code. */
volatile const __u32 fc_set_bits = 10;

/* Fibonacci hashing: the top bits of the tuple's folded words times
 * 2^32 / phi pick the set; consecutive values (client ports) land far
 * apart. One multiplication a packet. */
#define FC_GOLDEN 0x9e3779b1U

/* fc_hash is the hash of a packet's tuple: its top fc_set_bits pick the
 * set, the two below them the way a new flow may take over. */
static __always_inline __u32 fc_hash(const struct ns_pkt *p)
{
	__u32 s = p->saddr.w[0] ^ p->saddr.w[1] ^ p->saddr.w[2] ^ p->saddr.w[3];
	__u32 d = p->daddr.w[0] ^ p->daddr.w[1] ^ p->daddr.w[2] ^ p->daddr.w[3];

	return (s ^ (d << 16 | d >> 16) ^ ((__u32)p->sport << 16 | p->dport) ^ p->proto) *
	       FC_GOLDEN;
}

static __always_inline __u32 fc_set_index(__u32 hash)
{
	return hash >> (32 - fc_set_bits);
}

/* fc_set_of is set hash of this CPU's part of the cache. */
static __always_inline struct ns_flow_set *fc_set_of(__u32 hash)
{
	__u32 idx = bpf_get_smp_processor_id() << fc_set_bits | fc_set_index(hash);

	return bpf_map_lookup_elem(&ns_flow_cache, &idx);
}

/* fc_addr writes the address of hi and lo (struct ns_flow) to out. */
static __always_inline void fc_addr(__u8 *out, const __u8 *hi, __be32 lo)
{
	__builtin_memcpy(out, hi, 12);
	__builtin_memcpy(out + 12, &lo, 4);
}

/* The first 12 bytes of both key addresses, in words. */
_Static_assert(offsetof(struct ns_flow, daddr_hi) == offsetof(struct ns_flow, saddr_hi) + 12,
	       "struct ns_flow: saddr_hi and daddr_hi together");

/* fc_same_key: entries a and b hold the same tuple: addresses, ports and
 * protocol. A tuple is either a client's (to a frontend) or a backend's
 * reply (to a nat port, which the agent keeps above the NodePort range),
 * never both, so the direction need not be compared. */
static __always_inline bool fc_same_key(const struct ns_flow *a, const struct ns_flow *b)
{
	const __u32 *x = (const __u32 *)a->saddr_hi, *y = (const __u32 *)b->saddr_hi;

	return a->sport == b->sport && a->dport == b->dport && a->proto == b->proto &&
	       a->saddr_lo == b->saddr_lo && a->daddr_lo == b->daddr_lo && a->v6 == b->v6 &&
	       x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] &&
	       x[5] == y[5];
}

/* fc_match: f is the entry of p's tuple. The ports first: flows from one
 * client differ only there. An IPv4 entry's and packet's first 12 bytes
 * of each address are the v4-mapped prefix: compared for IPv6 only, the
 * hit reads the entry's first line alone. */
static __always_inline bool fc_match(const struct ns_flow *f, const struct ns_pkt *p)
{
	const __u32 *hi = (const __u32 *)f->saddr_hi;

	if (f->sport != p->sport || f->dport != p->dport || f->proto != p->proto ||
	    f->saddr_lo != p->saddr.w[3] || f->daddr_lo != p->daddr.w[3] || f->v6 != p->v6)
		return false;
	return !p->v6 || (hi[0] == p->saddr.w[0] && hi[1] == p->saddr.w[1] && hi[2] == p->saddr.w[2] &&
			  hi[3] == p->daddr.w[0] && hi[4] == p->daddr.w[1] && hi[5] == p->daddr.w[2]);
}

/* fc_count adds what the entry took to the flow's CT entry e. */
static __always_inline void fc_count(struct ct_entry *e, const struct ns_flow *f)
{
	if (f->dir == NAT_DIR_INGRESS) {
		__sync_fetch_and_add(&e->rx_packets, f->packets);
		__sync_fetch_and_add(&e->rx_bytes, f->bytes);
	} else {
		__sync_fetch_and_add(&e->packets, f->packets);
		__sync_fetch_and_add(&e->bytes, f->bytes);
		/* The frontend's and the backend's share (events.h). */
		sl_count(e->rev_nat_id, e->backend_id, f->packets, f->bytes, 0);
	}
}

/* fc_give gives the counters of f to CT entry e, its flow's, if that is
 * still the flow f was filled for (created; not a later one on the same
 * tuple), and empties them. */
static __always_inline void fc_give(struct ct_entry *e, struct ns_flow *f)
{
	if (!f->packets)
		return;
	if (e && e->created == f->created)
		fc_count(e, f);
	f->packets = 0;
	f->bytes = 0;
}

/* fc_flush gives the counters of f (before it holds another flow, or
 * ends) to its own flow's CT entry: the service entry, whose key f's is,
 * or for a reply the ingress entry, client -> backend (fc_give). The key
 * is built in the per-CPU scratch (t). */
static __always_inline void fc_flush(struct ns_flow *f, struct ct_tuple *t)
{
	struct ct_entry *e;

	/* Written a part at a time (barrier): few values live at once. */
	if (f->dir == NAT_DIR_INGRESS) {
		fc_addr(t->saddr, f->to_daddr_hi, f->to_daddr_lo);
		barrier();
		fc_addr(t->daddr, f->saddr_hi, f->saddr_lo);
		t->sport = f->to_dport;
		t->dport = f->sport;
		t->dir = CT_DIR_INGRESS;
	} else {
		fc_addr(t->saddr, f->saddr_hi, f->saddr_lo);
		barrier();
		fc_addr(t->daddr, f->daddr_hi, f->daddr_lo);
		t->sport = f->sport;
		t->dport = f->dport;
		t->dir = f->dir;
	}
	t->proto = f->proto;
	t->scope = CT_SCOPE_NODE; /* the node's programs only */
	t->pad = 0;
	e = ct_lookup(t);
	fc_give(e, f);
}

/* fc_drop ends entry f, its counters given to its flow's CT entry: a
 * packet that may change the flow's state (a TCP FIN or RST, or a SYN that
 * starts a new flow on the tuple, perhaps to another backend) takes the
 * conntrack path, and so do the packets after it until the entry is filled
 * again. Whether the entry holds for this CT second or an earlier one:
 * its counters go to its own flow before conntrack may replace that flow
 * with a new one on the same tuple. A global function, verified once:
 * called on the hot path's rare branch, it keeps the service path's frame
 * as it is. */
__noinline int fc_drop(struct ns_flow *f)
{
	struct ct_scratch *s = ns_scratch();

	if (!f || !s)
		return 0;
	if (f->packets)
		fc_flush(f, &s->tuple);
	f->fib.at = 0;
	return 0;
}

/* fc_lookup returns the entry for p, whose length for the MTU is l3_len
 * (ns_mtu_len: one segment of a GSO packet), when it holds for CT second
 * now and p is no longer than the packet its FIB result passed (the MTU
 * check); else NULL. A packet that may change
 * its flow's CT state (TCP SYN, FIN, RST) ends the entry (fc_drop). */
static __always_inline struct ns_flow *fc_lookup(const struct ns_pkt *p, __u32 hash,
						 __u32 now, __u32 l3_len)
{
	struct ns_flow_set *set;
	struct ns_flow *f = NULL;
	int i;

	if (!fc_set_bits)
		return NULL;
	set = fc_set_of(hash);
	if (!set)
		return NULL;
#pragma unroll
	for (i = 0; i < NS_FLOW_WAYS; i++) {
		if (fc_match(&set->way[i], p)) {
			f = &set->way[i];
			break;
		}
	}
	if (!f)
		return NULL;
	if (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)) {
		if (f->fib.at || f->packets)
			fc_drop(f);
		return NULL;
	}
	return f->fib.at == now && l3_len <= f->fib.max_len ? f : NULL;
}

/* fc_steady: CT entry e (reply: an ingress entry) is in a state that no
 * packet the cache takes would change: fc_lookup refuses SYN, FIN and RST,
 * so for TCP that is an established flow, and for replies any entry not
 * closing (the reply being recorded has just set SEEN_REPLY, the one flag
 * a plain reply sets: ct_next_flags). */
static __always_inline bool fc_steady(const struct ct_entry *e, __u8 proto, bool reply)
{
	__u16 flags = e->flags;

	/* A new flow (CT_F_NEW) may be cached too: an entry holds for one CT
	 * second, and the first packet of the next goes through conntrack,
	 * which moves the flow to ct once established (ct_ready): a UDP flow
	 * then, a TCP flow at the ACK that made it cacheable at all. */
	if (flags & CT_F_CLOSING)
		return false;
	if (reply)
		return flags & CT_F_SEEN_REPLY;
	return proto != IPPROTO_TCP || (flags & CT_F_ESTABLISHED);
}

/* fc_fill records the flow staged by fc_record in the scratch's flow (the
 * packet's tuple, direction, and what it becomes) in the cache, in set
 * hash, with where it goes: the FIB result its CT entry e kept this CT
 * second (e->fib.at). The entry goes to the flow's own way, else one not
 * in use this second, else one picked by the hash; one that still holds
 * counters of another flow gives them to that flow first.
 *
 * A global function, so the verifier walks it once rather than at each of
 * the service path's states that reach it (inlined, it tripled
 * xdp_lb_ingress's processed instructions). Its frame adds to the service
 * path's (the stack budget: ns_maps.h), so it keeps few values: what
 * it needs is staged in the scratch, the loop reloads the staged key for
 * each way (barrier), and nothing is called under it. */
__noinline int fc_fill(struct ct_entry *e, __u32 hash)
{
	struct ns_flow *f = NULL, *stale = NULL;
	__u32 key = bpf_get_smp_processor_id() << fc_set_bits | fc_set_index(hash), now;
	struct ns_flow_set *set;
	struct ct_scratch *s;
	int i;

	/* One key slot for both lookups: each stack byte here counts. */
	set = bpf_map_lookup_elem(&ns_flow_cache, &key);
	key = 0;
	s = bpf_map_lookup_elem(&ns_scratch_map, &key);
	if (!e || !s || !set)
		return 0;
	now = e->fib.at;
	for (i = 0; i < NS_FLOW_WAYS; i++) {
		struct ns_flow *w = &set->way[i];

		barrier();
		if (fc_same_key(w, &s->flow)) {
			f = w;
			break;
		}
		if (!stale && w->fib.at != now)
			stale = w;
	}
	if (f) {
		fc_give(e, f);
	} else {
		f = stale ? stale : &set->way[(hash >> (30 - fc_set_bits)) & (NS_FLOW_WAYS - 1)];
		if (f->packets)
			fc_flush(f, &s->tuple);
	}
	/* Not valid while it changes (at last), as ns_fib_keep does: a
	 * program that ran on this CPU in between (threaded NAPI, PREEMPT_RT)
	 * never pairs the new key with the old way out. */
	WRITE_ONCE(f->fib.at, 0);
	barrier();
	__builtin_memcpy(f, &s->flow, offsetof(struct ns_flow, packets));
	__builtin_memcpy(f->saddr_hi, s->flow.saddr_hi, offsetof(struct ns_flow, created) -
			 offsetof(struct ns_flow, saddr_hi));
	__builtin_memcpy(&f->fib, &e->fib, offsetof(struct ct_fib, at));
	f->created = e->created;
	barrier();
	WRITE_ONCE(f->fib.at, now);
	return 0;
}

/* fc_record lets the packets of p's flow that follow in CT second now take
 * the cache: p (before translation) becomes saddr:sport -> daddr:dport and
 * leaves as the FIB result kept in its CT entry e says. dir is
 * CT_DIR_SERVICE or, for a reply, NAT_DIR_INGRESS. Only when e kept a FIB
 * result this second and its state is steady. */
static __always_inline void fc_record(const struct ns_pkt *p, __u8 dir,
				      const union lb_addr *saddr, __be16 sport,
				      const union lb_addr *daddr, __be16 dport,
				      struct ct_entry *e, __u32 now)
{
	struct ct_scratch *s;

	if (!fc_set_bits || READ_ONCE(e->fib.at) != now || !e->fib.ifindex ||
	    !fc_steady(e, p->proto, dir == NAT_DIR_INGRESS))
		return;
	s = ns_scratch();
	if (!s)
		return;
	/* Staged a part at a time (barrier): few values live at once. */
	__builtin_memcpy(s->flow.saddr_hi, p->saddr.b, 12);
	s->flow.saddr_lo = p->saddr.w[3];
	barrier();
	__builtin_memcpy(s->flow.daddr_hi, p->daddr.b, 12);
	s->flow.daddr_lo = p->daddr.w[3];
	barrier();
	__builtin_memcpy(s->flow.to_saddr_hi, saddr->b, 12);
	s->flow.to_saddr_lo = saddr->w[3];
	barrier();
	__builtin_memcpy(s->flow.to_daddr_hi, daddr->b, 12);
	s->flow.to_daddr_lo = daddr->w[3];
	s->flow.sport = p->sport;
	s->flow.dport = p->dport;
	s->flow.proto = p->proto;
	s->flow.dir = dir;
	s->flow.v6 = p->v6;
	s->flow.pad = 0;
	s->flow.to_sport = sport;
	s->flow.to_dport = dport;
	fc_fill(e, fc_hash(p));
}

#endif /* __SLUICE_FLOWCACHE_H */
