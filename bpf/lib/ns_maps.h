/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps of the north-south (tc and XDP) load balancer, in addition to the
 * LB maps of maps.h, which it shares with the socket LB through the pins.
 * Layouts and byte order are in ct_abi.h.
 */
#ifndef __SLUICE_NS_MAPS_H
#define __SLUICE_NS_MAPS_H

#include "common.h"
#include "ct_abi.h"
#include "l4.h"

/* Conntrack of established TCP flows, both families: ct_tuple (CT_DIR_*)
 * -> ct_entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct SEC(".maps");

/* Conntrack of the established flows of every other protocol (UDP), as
 * Cilium keeps ct_any beside its TCP table: a flood of UDP flows that get
 * answers (DNS, QUIC) churns this one and never evicts a TCP connection. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct_any SEC(".maps");

/* SNAT mappings of established TCP flows, both families and directions:
 * ct_tuple (NAT_DIR_*) -> the address and port to translate to. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct nat_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat SEC(".maps");

/* SNAT mappings of the other protocols' established flows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct nat_entry);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_any SEC(".maps");

/* The established tables by protocol, [0] TCP's (ct, snat), [1] the
 * rest's (ct_any, snat_any), filled by the loader. Looked up through these
 * rather than by name: the verifier sees one inner map either way, so the
 * paths after a lookup stay one (two map pointers would double every state
 * from there on). Not pinned: each object holds its own, of the same pins. */
struct ct_est_inner {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, 65536);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
	__array(values, struct ct_est_inner);
} ct_est SEC(".maps");

struct snat_est_inner {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct nat_entry);
	__uint(max_entries, 65536);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 2);
	__array(values, struct snat_est_inner);
} snat_est SEC(".maps");

/* The new flows' conntrack and SNAT mappings, as ct and snat: a flow is
 * written here first (CT_F_NEW) and moves to ct and snat once established
 * (ct.h). An LRU map evicts by age alone: in one table, a flood of spoofed
 * SYNs would evict the entries of connections idle for a few seconds
 * (connection pools, websockets) and reset them. Here the flood churns
 * these two tables only, and an established flow is never evicted by a new
 * one, as the kernel's conntrack evicts unreplied entries first
 * (early_drop). A legitimate new flow must complete its handshake before
 * the flood pushes it out: each CPU evicts its own oldest
 * (BPF_F_NO_COMMON_LRU: an LRU list per CPU, a third cheaper to evict from
 * under a flood than the shared one, measured), so with N CPUs a table of
 * E entries keeps one for about E / N / (the flood's rate on that CPU).
 * max_entries is set at load (the agent sizes them from memory, a quarter
 * of ct and snat; snat_new at most an entry per nat port). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct ct_entry);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct_new SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_tuple);
	__type(value, struct nat_entry);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_COMMON_LRU);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_new SEC(".maps");

/* Agent configuration of the tc/XDP programs, one entry at index 0. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ns_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ns_config SEC(".maps");

/* The half-open TCP flows (ct.h: a SYN's ingress entry and, masqueraded,
 * its reply mapping), direct-mapped: a keyed hash of the key picks one
 * slot of each table, and a new flow's SYN overwrites whatever flow was
 * there, as an LRU evicts its oldest. A SYN costs two slot writes (a
 * compare and swap, the stores, an atomic add) instead of two LRU inserts
 * into full tables (a free-list pop, a bucket walk and its lock, each):
 * masqueraded SYNs 1.5x as fast, measured (docs/benchmarks.md,
 * 2026-12-02). A flood churns these tables alone, as it churned
 * ct_new and snat_new: a legitimate flow's handshake must complete before
 * the flood's SYNs hit its slot, about slots / rate seconds on average
 * (16,384 slots at 20,000 SYNs a second: 0.8 s, against a round trip).
 * Lookups of CT_DIR_INGRESS and NAT_DIR_INGRESS keys read them after the
 * established tables, before ct_new and snat_new (ct_lookup_in,
 * snat_lookup_in). A completed handshake moves the flow to the established
 * tables and empties the slots (nat.h: ct_complete). Nothing collects a
 * slot: a dead half-open flow stays until a SYN takes its slot, and what
 * reads one checks the lifetime as for any entry the GC has not reached
 * (the reply path, ct_complete, snat_port_free); an entry of its key
 * written elsewhere empties it (ct_put).
 *
 * Concurrency: a writer takes the slot by turning its version odd (a
 * compare and swap, which fails while another CPU writes it), writes key
 * and value, and makes it even again; a reader checks the key between two
 * reads of an even version. A packet that found the slot may still use its
 * value after another CPU's SYN took it over, as an LRU map's element is
 * reused at once after an eviction while a program holds it: the same
 * guarantee as the tables they replace for the half-open flows. A nat
 * claim (nat.h: snat_try_claim) never overwrites a slot of its own key:
 * that port is taken.
 *
 * Sized at load (ns_half_ct_bits, ns_half_nat_bits: log2 of the slots; 0
 * would turn them off, every flow to ct_new and snat_new): ct_half as ct_new,
 * snat_half to at most half the nat ports (NewNATEntries), so that a flood
 * holds at most about half the ports to one backend. */
volatile const __u32 ns_half_ct_bits = 14;
volatile const __u32 ns_half_nat_bits = 14;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_half_slot);
	__uint(max_entries, 1 << 14);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ct_half SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct nat_half_slot);
	__uint(max_entries, 1 << 14);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} snat_half SEC(".maps");

/* half_hash is the keyed hash of t: its five 64-bit words, each mixed
 * into a state that starts as ns_config's hash_key with a multiplication
 * by 2^64 / phi and a fold of the high half, then murmur3's finalizer. A
 * client cannot pick tuples that land in another's slot without the key.
 * Five multiplications (ten rounds of the finalizer cost twice the
 * instructions). lbmap.HalfHash is the same; half_hash_k takes the key. */
static __always_inline __u32 half_hash_k(const struct ct_tuple *t, __u64 h)
{
	const __u32 *w = (const __u32 *)t;
	int i;

#pragma unroll
	for (i = 0; i < (int)(sizeof(*t) / 8); i++) {
		h ^= (__u64)w[2 * i + 1] << 32 | w[2 * i];
		h *= 0x9e3779b97f4a7c15ULL;
		h ^= h >> 32;
	}
	return hash_fmix32((__u32)h);
}

/* half_hash: half_hash_k with ns_config's key. */
static __always_inline __u32 half_hash(const struct ct_tuple *t)
{
	__u32 zero = 0;
	const struct ns_config *cfg = bpf_map_lookup_elem(&ns_config, &zero);

	return half_hash_k(t, cfg ? cfg->hash_key : 0);
}

_Static_assert(sizeof(struct ct_tuple) == 40, "ct_tuple: ten words");

/* The flow filter: for each table a new flow's path looks keys up in that
 * it mostly does not hold (the TCP tables ct and snat, ct_new, snat_new),
 * an array of bits, one per value of the top bits of a key's half_hash,
 * set before the key is written. A clear bit says no entry has the key:
 * the lookup, a bucket of a table of up to millions read from memory, is
 * skipped (a masqueraded SYN makes six such lookups, all of absent keys).
 * The datapath never clears a bit (an entry evicted or deleted leaves its
 * own, a false "maybe" that costs the lookup); the agent rebuilds each
 * table's (lbmap.Filter, at each GC): of two generations, both set by the
 * datapath, it zeroes the one not read, sets the bits of every key the
 * table then holds (a dump: a key written before the zero ended is in it;
 * one written after has its bit set after), and makes it the one read.
 *
 * One element a table (NS_FF_*): its control word, the generation read (1
 * or 2; anything else turns the table's filter off, every lookup made:
 * until the first rebuild, and from the moment the hash key changes), a
 * copy of the hash key (the agent writes it with the filter off, before
 * the rebuild that turns it on: while on, it is ns_config's) and of the
 * bits below (a program loaded with others is refused: its bits would be
 * another's, lbmap.CheckFilterBits), then the two generations of 2^ns_ff_bits bits each (set at load,
 * lbmap.ConfigureFilter: about eight bits an entry of the largest table,
 * at most 2^NS_FF_MAX_BITS, 256 KiB; 0, no filter), in an element of room
 * for the most (2 MiB in all, whatever the tables' sizes). The element's key is read from ns_ff_keys, a map value:
 * no stack slot for it on the deepest call chains (6.1's 512 bytes). */
#define NS_FF_CT       0
#define NS_FF_CT_NEW   1
#define NS_FF_SNAT     2
#define NS_FF_SNAT_NEW 3
#define NS_FF_TABLES   4

volatile const __u32 ns_ff_bits = 19; /* tables of 65536 */
volatile const __u32 ns_ff_keys[NS_FF_TABLES] = {NS_FF_CT, NS_FF_CT_NEW, NS_FF_SNAT, NS_FF_SNAT_NEW};

#define NS_FF_MAX_BITS 21
#define NS_FF_WORDS    (2 * (1 << (NS_FF_MAX_BITS - 6)))

struct ns_ff_table {
	__u64 ctl;
	__u32 key;            /* ns_config's hash_key, whenever ctl is on */
	__u32 bits;           /* the agent's ns_ff_bits: a loader checks its own */
	__u64 w[NS_FF_WORDS]; /* two generations of up to 2^NS_FF_MAX_BITS */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct ns_ff_table);
	__uint(max_entries, NS_FF_TABLES);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flow_filter SEC(".maps");

/* ff_table is table tab's filter, NULL when there is none. */
static __always_inline struct ns_ff_table *ff_table(__u32 tab)
{
	if (!ns_ff_bits || tab >= NS_FF_TABLES)
		return NULL;
	return bpf_map_lookup_elem(&flow_filter, (const void *)&ns_ff_keys[tab]);
}

/* ff_word is the word of generation g (0 or 1) of filter f that holds the
 * bit of hash h; ff_bit is that bit. */
static __always_inline __u64 *ff_word(struct ns_ff_table *f, __u32 g, __u32 h)
{
	__u32 bits = ns_ff_bits;
	__u32 i = (g << ((bits - 6) & 31)) + ((h >> ((32 - bits) & 31)) >> 6);

	if (i >= NS_FF_WORDS)
		return NULL;
	return &f->w[i];
}

static __always_inline __u64 ff_bit(__u32 h)
{
	return 1ULL << ((h >> ((32 - ns_ff_bits) & 31)) & 63);
}

/* ff_absent: no entry of table tab has a key of hash h (its filter is on
 * and the key's bit clear). */
static __always_inline bool ff_absent(__u32 tab, __u32 h)
{
	struct ns_ff_table *f = ff_table(tab);
	__u64 g, *w;

	if (!f)
		return false;
	g = READ_ONCE(f->ctl);
	if (g != 1 && g != 2)
		return false;
	w = ff_word(f, g - 1, h);
	return w && !(READ_ONCE(*w) & ff_bit(h));
}

/* ff_add sets the bit of hash h in both generations of table tab's
 * filter (ff_set: of filter f), before its key is written (a reader that finds the entry then
 * finds the bit: a nat claim's check of the other tables, nat.h, relies
 * on it). An atomic or, only where the bit is clear. */
static __always_inline void ff_set(struct ns_ff_table *f, __u32 h)
{
	__u64 *w;

	w = ff_word(f, 0, h);
	if (w && !(READ_ONCE(*w) & ff_bit(h)))
		__sync_fetch_and_or(w, ff_bit(h));
	w = ff_word(f, 1, h);
	if (w && !(READ_ONCE(*w) & ff_bit(h)))
		__sync_fetch_and_or(w, ff_bit(h));
}

static __always_inline void ff_add(__u32 tab, __u32 h)
{
	struct ns_ff_table *f = ff_table(tab);

	if (f)
		ff_set(f, h);
}

/* ff_add_key is ff_add of key t's hash, made with the filter's copy of
 * the hash key: no lookup of ns_config between the filter's and the hash,
 * which would spill the filter's pointer or the key's words (frames of up
 * to 64 bytes more on the deepest call chains, 6.1's 512 bytes). */
static __always_inline void ff_add_key(__u32 tab, const struct ct_tuple *t)
{
	struct ns_ff_table *f = ff_table(tab);

	if (f)
		ff_set(f, half_hash_k(t, READ_ONCE(f->key)));
}

/* half_key_eq: keys a and b are the same tuple. */
static __always_inline bool half_key_eq(const struct ct_tuple *a, const struct ct_tuple *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] &&
	       x[5] == y[5] && x[6] == y[6] && x[7] == y[7] && x[8] == y[8] && x[9] == y[9];
}

/* half_lock takes the slot of version word ver for a write, seen at v
 * (even): false when another CPU writes it or took it since. */
static __always_inline bool half_lock(__u64 *ver, __u64 v)
{
	return !(v & 1) && __sync_val_compare_and_swap(ver, v, v + 1) == v;
}

/* half_unlock ends a write of the slot of version word ver. */
static __always_inline void half_unlock(__u64 *ver)
{
	/* An add that fetches (its value used): a full barrier on every JIT
	 * (x86's lock xadd; arm64's, acquire and release), so the key and
	 * value show before the even version, and a claim's write before its
	 * checks of the other tables (nat.h). One that does not fetch is
	 * arm64's stadd, which orders nothing. */
	__u64 v = __sync_fetch_and_add(ver, 1);

	barrier_var(v);
}

_Static_assert(__builtin_offsetof(struct ct_half_slot, key) ==
		       __builtin_offsetof(struct nat_half_slot, key),
	       "half slots: version and key first");

/* half_has_slot: key t may have a slot of ct_half (nat: snat_half): slots
 * are on, and t is of the table's direction (CT_DIR_INGRESS,
 * NAT_DIR_INGRESS). */
static __always_inline bool half_has_slot(const struct ct_tuple *t, __u32 nat)
{
	return (nat ? ns_half_nat_bits : ns_half_ct_bits) &&
	       t->dir == (nat ? NAT_DIR_INGRESS : CT_DIR_INGRESS);
}

/* half_idx is the index of the slot of key t in ct_half (nat: snat_half),
 * -1 when t has none (half_has_slot); half_idx_h, given t's hash h. */
static __always_inline int half_idx_h(const struct ct_tuple *t, __u32 nat, __u32 h)
{
	__u32 bits = nat ? ns_half_nat_bits : ns_half_ct_bits;

	return half_has_slot(t, nat) ? (int)(h >> ((32 - bits) & 31)) : -1;
}

static __always_inline int half_idx(const struct ct_tuple *t, __u32 nat)
{
	__u32 bits = nat ? ns_half_nat_bits : ns_half_ct_bits;

	return half_has_slot(t, nat) ? (int)(half_hash(t) >> ((32 - bits) & 31)) : -1;
}

/* half_at is the slot at index i (< 0: none) of ct_half (nat: snat_half),
 * as a ct_half_slot: both kinds begin with the version and the key. */
static __always_inline struct ct_half_slot *half_at(int i, __u32 nat)
{
	__u32 idx = i;

	if (i < 0)
		return NULL;
	return nat ? bpf_map_lookup_elem(&snat_half, &idx) : bpf_map_lookup_elem(&ct_half, &idx);
}

/* half_held: the slot at index i holds key t, stably (its version even,
 * the same before and after the key was compared). */
static __always_inline bool half_held(const struct ct_tuple *t, __u32 nat, int i)
{
	struct ct_half_slot *sl = half_at(i, nat);
	__u64 v;

	if (!sl)
		return false;
	v = READ_ONCE(sl->ver);
	return !(v & 1) && half_key_eq(&sl->key, t) && READ_ONCE(sl->ver) == v;
}

/* half_find is the index of the slot of key t while it holds t, else -1;
 * half_find_h, given t's hash h. */
static __always_inline int half_find(const struct ct_tuple *t, __u32 nat)
{
	int i = half_idx(t, nat);

	return half_held(t, nat, i) ? i : -1;
}

static __always_inline int half_find_h(const struct ct_tuple *t, __u32 nat, __u32 h)
{
	int i = half_idx_h(t, nat, h);

	return half_held(t, nat, i) ? i : -1;
}

/* half_put writes val under key t into its slot (of index i, < 0: none),
 * over any other flow's (claim: unless it holds t already: that nat port
 * is taken, the caller decides): 0 when written, -1 when slots are off or
 * another CPU writes the slot. */
static __always_inline int half_put(const struct ct_tuple *t, const void *val, __u32 nat,
				    bool claim, int i)
{
	struct ct_half_slot *sl = half_at(i, nat);
	__u64 v;

	if (!sl)
		return -1;
	v = READ_ONCE(sl->ver);
	if ((claim && half_key_eq(&sl->key, t)) || !half_lock(&sl->ver, v))
		return -1;
	__builtin_memcpy(&sl->key, t, sizeof(sl->key));
	if (nat)
		__builtin_memcpy(&((struct nat_half_slot *)sl)->n, val, sizeof(struct nat_entry));
	else
		__builtin_memcpy(&sl->e, val, sizeof(sl->e));
	half_unlock(&sl->ver);
	return 0;
}

/* half_clear empties the slot of key t while it holds t: a write, so a
 * CPU that takes the slot meanwhile keeps its flow. */
static __always_inline void half_clear(const struct ct_tuple *t, __u32 nat)
{
	struct ct_half_slot *sl = half_at(half_idx(t, nat), nat);

	if (sl && half_key_eq(&sl->key, t) && half_lock(&sl->ver, READ_ONCE(sl->ver))) {
		__builtin_memset(&sl->key, 0, sizeof(sl->key));
		half_unlock(&sl->ver);
	}
}

/* The slot functions the service path calls: global, each verified once
 * (the hash and the compare are ~150 instructions, and the lookups that
 * read a slot are many). snat_claim, at the end of the deepest call chain
 * (6.1's 512 bytes, 32 a call), inlines its own (the _h lookups, given
 * the key's hash). */

/* half_slot is half_find, but for a key that has a slot it does not
 * hold, -2 - the slot's index (half_unheld gives it back): -1 when t has
 * no slot. */
__noinline int half_slot(const struct ct_tuple *t, __u32 nat)
{
	int i;

	if (!t || (i = half_idx(t, nat)) < 0)
		return -1;
	return half_held(t, nat, i) ? i : -2 - i;
}

/* half_slot_h is half_slot given t's hash h (the caller hashed it for
 * the flow filter). */
__noinline int half_slot_h(const struct ct_tuple *t, __u32 nat, __u32 h)
{
	int i;

	if (!t || (i = half_idx_h(t, nat, h)) < 0)
		return -1;
	return half_held(t, nat, i) ? i : -2 - i;
}

/* half_unheld is the slot's index of what half_slot returned, -1: none. */
static __always_inline int half_unheld(int r)
{
	return r >= -1 ? r : -2 - r;
}

/* ct_half_put writes the half-open flow's ingress entry e under key t
 * into its slot (of index i, from half_slot; < 0: unknown), over any other
 * flow's: 0 when written, -1 when not (the caller writes ct_new then). */
__noinline int ct_half_put(const struct ct_tuple *t, const struct ct_entry *e, int i)
{
	if (!t || !e)
		return -1;
	return half_put(t, e, 0, false, i < 0 ? half_idx(t, 0) : i);
}

/* ct_half_entry is the entry of the slot of index i (< 0: none). */
static __always_inline struct ct_entry *ct_half_entry(int i)
{
	struct ct_half_slot *sl = half_at(i, 0);

	if (!sl)
		return NULL;
	barrier_var(sl); /* the offset added after the check, not before */
	return &sl->e;
}

/* ct_half_at is the entry of the slot of index i while it holds key t. */
static __always_inline struct ct_entry *ct_half_at(int i, const struct ct_tuple *t)
{
	return half_held(t, 0, i) ? ct_half_entry(i) : NULL;
}

/* half_delete: half_clear. */
__noinline int half_delete(const struct ct_tuple *t, __u32 nat)
{
	if (t)
		half_clear(t, nat);
	return 0;
}

/* ct_half_lookup finds the half-open flow's ingress entry under key t. */
static __always_inline struct ct_entry *ct_half_lookup(const struct ct_tuple *t)
{
	return t->dir == CT_DIR_INGRESS ? ct_half_entry(half_slot(t, 0)) : NULL;
}

/* snat_half_lookup finds the half-open flow's reply mapping under key t;
 * _h, inlined, given t's hash h. */
static __always_inline struct nat_entry *snat_half_lookup(const struct ct_tuple *t)
{
	struct nat_half_slot *sl;

	if (t->dir != NAT_DIR_INGRESS)
		return NULL;
	sl = (struct nat_half_slot *)half_at(half_slot(t, 1), 1);
	if (!sl)
		return NULL;
	barrier_var(sl);
	return &sl->n;
}

static __always_inline struct nat_entry *snat_half_lookup_h(const struct ct_tuple *t, __u32 h)
{
	struct nat_half_slot *sl = (struct nat_half_slot *)half_at(half_find_h(t, 1, h), 1);

	if (!sl)
		return NULL;
	barrier_var(sl);
	return &sl->n;
}

static __always_inline void ct_half_delete(const struct ct_tuple *t)
{
	half_delete(t, 0);
}

static __always_inline void snat_half_delete(const struct ct_tuple *t)
{
	half_delete(t, 1);
}

/* ct_new_lookup finds a new flow's entry under key t: a half-open flow's
 * ingress entry in its slot, else in ct_new. */
static __always_inline struct ct_entry *ct_new_lookup(const struct ct_tuple *t)
{
	struct ct_entry *e = ct_half_lookup(t);

	return e ? e : bpf_map_lookup_elem(&ct_new, t);
}

/* snat_new_lookup finds a new flow's mapping under key t: a half-open
 * flow's reply mapping in its slot, else in snat_new. */
static __always_inline struct nat_entry *snat_new_lookup(const struct ct_tuple *t)
{
	struct nat_entry *n = snat_half_lookup(t);

	return n ? n : bpf_map_lookup_elem(&snat_new, t);
}

/* snat_new_delete_i deletes a new flow's mapping under key t, wherever
 * (inlined: snat_claim's). */
static __always_inline void snat_new_delete_i(const struct ct_tuple *t)
{
	half_clear(t, 1);
	bpf_map_delete_elem(&snat_new, t);
}

/* ct_est_of is the established flows' conntrack table of proto. */
static __always_inline void *ct_est_of(__u8 proto)
{
	__u32 i = proto != IPPROTO_TCP;

	return bpf_map_lookup_elem(&ct_est, &i);
}

/* snat_est_of is the established flows' SNAT table of proto. */
static __always_inline void *snat_est_of(__u8 proto)
{
	__u32 i = proto != IPPROTO_TCP;

	return bpf_map_lookup_elem(&snat_est, &i);
}

/* ct_est_lookup finds the entry under key t among the established flows. */
static __always_inline struct ct_entry *ct_est_lookup(const struct ct_tuple *t)
{
	void *m = ct_est_of(t->proto);

	return m ? bpf_map_lookup_elem(m, t) : NULL;
}

/* ct_est_lookup_h is ct_est_lookup for a key of hash h: none without a
 * lookup when the flow filter says so (TCP's table has one). */
static __always_inline struct ct_entry *ct_est_lookup_h(const struct ct_tuple *t, __u32 h)
{
	if (t->proto == IPPROTO_TCP && ff_absent(NS_FF_CT, h))
		return NULL;
	return ct_est_lookup(t);
}

/* ct_est_update writes an established flow's entry, its bit in the flow
 * filter first (TCP's). */
static __always_inline long ct_est_update(const struct ct_tuple *t, const struct ct_entry *e,
					  __u64 uflags)
{
	void *m = ct_est_of(t->proto);

	if (t->proto == IPPROTO_TCP)
		ff_add_key(NS_FF_CT, t);
	return m ? bpf_map_update_elem(m, t, e, uflags) : -1;
}

static __always_inline long ct_est_delete(const struct ct_tuple *t)
{
	void *m = ct_est_of(t->proto);

	return m ? bpf_map_delete_elem(m, t) : -1;
}

static __always_inline struct nat_entry *snat_est_lookup(const struct ct_tuple *t)
{
	void *m = snat_est_of(t->proto);

	return m ? bpf_map_lookup_elem(m, t) : NULL;
}

/* snat_est_lookup_h: ct_est_lookup_h. */
static __always_inline struct nat_entry *snat_est_lookup_h(const struct ct_tuple *t, __u32 h)
{
	if (t->proto == IPPROTO_TCP && ff_absent(NS_FF_SNAT, h))
		return NULL;
	return snat_est_lookup(t);
}

/* snat_est_update_h writes an established flow's mapping under key t (of
 * hash h), its bit in the flow filter first (TCP's); _update hashes. */
static __always_inline long snat_est_update_h(const struct ct_tuple *t, const struct nat_entry *n,
					      __u64 uflags, __u32 h)
{
	void *m = snat_est_of(t->proto);

	if (t->proto == IPPROTO_TCP)
		ff_add(NS_FF_SNAT, h);
	return m ? bpf_map_update_elem(m, t, n, uflags) : -1;
}

static __always_inline long snat_est_update(const struct ct_tuple *t, const struct nat_entry *n,
					    __u64 uflags)
{
	void *m = snat_est_of(t->proto);

	if (t->proto == IPPROTO_TCP)
		ff_add_key(NS_FF_SNAT, t);
	return m ? bpf_map_update_elem(m, t, n, uflags) : -1;
}

/* ct_new_update writes a new flow's entry into ct_new, its bit in the
 * flow filter first; ct_new_lookup_h looks ct_new up for a key of hash h
 * unless the filter says none has it. snat_new's likewise. */
static __always_inline long ct_new_update(const struct ct_tuple *t, const struct ct_entry *e,
					  __u64 uflags)
{
	ff_add_key(NS_FF_CT_NEW, t);
	return bpf_map_update_elem(&ct_new, t, e, uflags);
}

static __always_inline struct ct_entry *ct_new_lookup_h(const struct ct_tuple *t, __u32 h)
{
	return ff_absent(NS_FF_CT_NEW, h) ? NULL : bpf_map_lookup_elem(&ct_new, t);
}

static __always_inline long snat_new_update_h(const struct ct_tuple *t, const struct nat_entry *n,
					      __u64 uflags, __u32 h)
{
	ff_add(NS_FF_SNAT_NEW, h);
	return bpf_map_update_elem(&snat_new, t, n, uflags);
}

static __always_inline long snat_new_update(const struct ct_tuple *t, const struct nat_entry *n,
					    __u64 uflags)
{
	ff_add_key(NS_FF_SNAT_NEW, t);
	return bpf_map_update_elem(&snat_new, t, n, uflags);
}

static __always_inline struct nat_entry *snat_new_lookup_h(const struct ct_tuple *t, __u32 h)
{
	return ff_absent(NS_FF_SNAT_NEW, h) ? NULL : bpf_map_lookup_elem(&snat_new, t);
}

static __always_inline long snat_est_delete(const struct ct_tuple *t)
{
	void *m = snat_est_of(t->proto);

	return m ? bpf_map_delete_elem(m, t) : -1;
}

/* ct_lookup finds the entry under key t: an established flow's in its
 * protocol's table (one lookup for the common case), else a new flow's in
 * ct_new (CT_F_NEW; not a half-open one's: ct_lookup_in). ct_move writes the established table before it
 * deletes from ct_new, so a miss in both can only be a move on another CPU
 * between the two lookups: the established table has the entry then, and
 * a second look there finds it (a cost only on misses). */
static __always_inline struct ct_entry *ct_lookup(const struct ct_tuple *t)
{
	struct ct_entry *e = ct_est_lookup(t);

	if (e)
		return e;
	e = bpf_map_lookup_elem(&ct_new, t);
	return e ? e : ct_est_lookup(t);
}

/* ct_lookup_in is ct_lookup for a key that may be a half-open flow's
 * (CT_DIR_INGRESS): its slot of ct_half after the established table. */
static __always_inline struct ct_entry *ct_lookup_in(const struct ct_tuple *t)
{
	struct ct_entry *e = ct_est_lookup(t);

	if (e)
		return e;
	e = ct_new_lookup(t);
	return e ? e : ct_est_lookup(t);
}

/* ct_lookup_in_h is ct_lookup_in given the key's hash (at h, in the
 * scratch: read after each lookup, not held across it on the stack of
 * snat_claim, the deepest frame), each table asked of the flow filter
 * first; inlined (snat_claim's). */
static __always_inline struct ct_entry *ct_lookup_in_h(const struct ct_tuple *t, const __u32 *h)
{
	struct ct_entry *e = ct_est_lookup_h(t, *h);

	if (e)
		return e;
	e = ct_half_entry(half_find_h(t, 0, *h));
	if (!e)
		e = ct_new_lookup_h(t, *h);
	return e ? e : ct_est_lookup_h(t, *h);
}

/* ct_lookup_syn is ct_lookup for a TCP SYN without ACK: the first packet
 * of a flow, or one sent again, whose flow is at most half-open (no
 * service entry, ct.h) or is one a client reuses the tuple of. It skips
 * the second look at the established table: an entry moving there from
 * ct_new in between is one whose handshake just completed, and a SYN on
 * it starts over either way. One lookup less on every new flow's path,
 * and the two left asked of the flow filter first. */
static __always_inline struct ct_entry *ct_lookup_syn(const struct ct_tuple *t)
{
	__u32 h = half_hash(t);
	struct ct_entry *e = ct_est_lookup_h(t, h);

	return e ? e : ct_new_lookup_h(t, h);
}

/* snat_lookup finds the mapping under key t: an established flow's in its
 * protocol's table, else a new flow's in snat_new (not a half-open one's:
 * snat_lookup_in). */
static __always_inline struct nat_entry *snat_lookup(const struct ct_tuple *t)
{
	struct nat_entry *n = snat_est_lookup(t);

	return n ? n : bpf_map_lookup_elem(&snat_new, t);
}

/* snat_lookup_in is snat_lookup for a key that may be a half-open flow's
 * (NAT_DIR_INGRESS): its slot of snat_half after the established table. */
static __always_inline struct nat_entry *snat_lookup_in(const struct ct_tuple *t)
{
	struct nat_entry *n = snat_est_lookup(t);

	return n ? n : snat_new_lookup(t);
}

/* snat_lookup_in_h: ct_lookup_in_h. */
static __always_inline struct nat_entry *snat_lookup_in_h(const struct ct_tuple *t, const __u32 *h)
{
	struct nat_entry *n = snat_est_lookup_h(t, *h);

	if (!n)
		n = snat_half_lookup_h(t, *h);
	return n ? n : snat_new_lookup_h(t, *h);
}

/* Host-side ifindex of each local pod's veth -> 1: a local backend behind
 * one of these is reached with bpf_redirect_peer, anything else through
 * the stack (redirect_peer drops on devices without a peer). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ns_pod_ifaces SEC(".maps");

#ifdef SLUICE_XDP
/* Ifindex -> 1 of each device XDP may redirect a translated packet to:
 * those the agent attached this XDP program to (AttachDevices), whose
 * drivers transmit XDP frames. Anything else (a VXLAN, Geneve or
 * WireGuard device, a VLAN device, a bridge, a device without XDP) fails
 * bpf_redirect, which drops: ns_xdp_defers. The object's own, not pinned:
 * each load fills its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ns_xdp_tx SEC(".maps");
#endif /* SLUICE_XDP */

/* Prefix -> node IP, where DSR sends a remote backend's traffic: a host
 * prefix per remote backend (its EndpointSlice nodeName), the other nodes'
 * pod CIDRs, and each node's own address (a known tunnel source). IPv4
 * v4-mapped. max_entries is set at load (lb_backends + 16384). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct tunnel_key);
	__type(value, struct tunnel_val);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ns_tunnel SEC(".maps");

/* Prefix -> the source a masqueraded flow to a backend inside it leaves
 * with, where that is not the node's address: the routes of --devices
 * other than the node's own (an overlay: flannel.1's routes to the other
 * nodes' pod CIDRs) with their preferred source or their device's address,
 * as MASQUERADE picks it. The agent mirrors the routes (snatroutes.go).
 * IPv4 v4-mapped. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct tunnel_key);
	__type(value, struct tunnel_val);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ns_snat_route SEC(".maps");

/* Per-CPU scratch: what the service path builds for a map call or a
 * helper (keys, values, the FIB question, the ICMP error it translates)
 * lives here, not on the stack. The stack budget: the verifier adds up the
 * frames of a BPF-to-BPF call chain and refuses more than 512 bytes, and
 * before 6.9 it rounds each frame up to 32 bytes (6.1 refused 464 + 40 bytes
 * as 480 + 64 = 544). The service path and its deepest callee are held to
 * 448 by 6.1's rule (TestPrivilegedVerifierHeadroom); its own locals are
 * the parsed packet, a few addresses and the spills. An array lookup costs
 * a helper call before 6.10 (inlined since), so the hot paths (a flow
 * cache hit, tc egress) keep their few bytes on the stack.
 *
 * Each field serves one step at a time: tuple each lookup or update in
 * turn, tuple2 and nat snat_egress and snat_refresh, entry the CT writes,
 * flow fc_record to fc_fill, fib ns_fib to ns_send, icmp an ICMP error's
 * translation. A program runs to its end on its CPU, and a redirect or
 * transmit happens after it returns, so no other run of this object's
 * programs writes the scratch meanwhile (tc and XDP objects have one
 * each). Never pinned: nothing in it outlives one program run. */
/* RFC 4727's experimental option types: IPv4 copied to fragments (number
 * 30); IPv6 skipped by a node that does not know it, not changed en
 * route. */
#define DSR_OPT4_TYPE 0x9e
#define DSR_OPT6_TYPE 0x1e

/* The backend in the outer IPv4 header: an option of 8 bytes. */
struct dsr_opt4 {
	__u8   type;
	__u8   len;
	__be16 port;
	__be32 addr;
};

/* The backend after the outer IPv6 header: a destination options header
 * of 24 bytes, the option and a PadN of 2. */
struct dsr_opt6 {
	__u8   nexthdr;
	__u8   hdrlen; /* in 8 bytes, less the first 8 */
	__u8   type;
	__u8   len;
	__be16 port;
	__u8   addr[16];
	__u8   pad_type; /* PadN */
	__u8   pad_len;
};

/* DSR in UDP (--dsr-dispatch=gue): GUE, variant 0 (draft-ietf-intarea-gue),
 * no flags, no extension fields; its private data names the backend. The
 * UDP source port carries the flow's hash, so a fabric's ECMP and a NIC's
 * RSS spread an LB node's flows as they spread any UDP. IPv4 uses the
 * first 12 bytes (the address's first 4), IPv6 all 24. */
#define DSR_GUE_KIND  0x534c /* private data as sluice's DSR writes it */
#define DSR_GUE4_LEN  12
#define DSR_GUE6_LEN  24

struct dsr_gue {
	__u8   hlen;     /* version 0, C 0, then 32-bit words after the first */
	__u8   proto;    /* the inner packet's: IPPROTO_IPIP, IPPROTO_IPV6 */
	__be16 flags;    /* none */
	__be16 kind;     /* DSR_GUE_KIND */
	__be16 port;     /* the backend's */
	__u8   addr[16]; /* the backend's; IPv4 in the first 4 bytes */
};

/* dsr_info is what a DSR packet brings the backend node: the LB node (the
 * outer source) and the backend it chose, when it says. */
struct dsr_info {
	union lb_addr node;
	union lb_addr backend;
	__be16 port;
	bool   has_backend;
	__u32  hash;   /* an LB node's: the flow's (dsr_encap) */
};

/* dsr_scratch is DSR's room off the stack: the outer header dsr_encap
 * builds, and on the backend node what the packet said and the service
 * key dsr_find_named walks. */
struct dsr_scratch {
	union {
		struct {
			struct iphdr    ip;
			struct dsr_opt4 opt;
		} h4;
		struct {
			struct ipv6hdr  ip;
			struct dsr_opt6 opt;
		} h6;
		struct {
			struct iphdr    ip;
			struct udphdr   udp;
			struct dsr_gue  gue;
		} g4;
		struct {
			struct ipv6hdr  ip;
			struct udphdr   udp;
			struct dsr_gue  gue;
		} g6;
	};
	struct dsr_info   info;
	struct lb_svc_key key;
};

/* snat_range is the nat ports of a configuration (nat.h, snat_range_of):
 * size ports from min on, less the hole (hole_size ports from hole_min; 0:
 * none), which snat_port_at skips. */
struct snat_range {
	__u32 min;
	__u32 size;
	__u32 hole_min;
	__u32 hole_size;
};

/* snat_scan's state (nat.h), shared by its bpf_loop steps. */
struct snat_scan {
	struct snat_range r;
	__u32 start;
	__u32 claimed;
};

struct ct_scratch {
	struct ct_tuple tuple;
	struct ct_entry entry;
	struct ct_tuple tuple2;    /* snat_refresh: the ingress mapping's key */
	struct nat_entry nat;
	struct ns_flow flow;       /* fc_record: what a packet becomes, for fc_fill */
	struct bpf_fib_lookup fib; /* ns_fib's question and answer, read by ns_send */
	__s32 fib_rc;              /* ns_xdp_route: the FIB's answer in fib */
	struct icmp_err icmp;      /* nodeport_icmp_ingress: the error it translates */
	__u32 ct_absent;           /* ns_established found no entry: the service
				    * path need not look again */
	__u32 ack_seq;             /* ct_promote_if_ready: the client's TCP ack
				    * number (host order), for ct_promote */
	__be16 sport;              /* ct_create_flow: the client port a new local
				    * flow's backend sees when rewritten
				    * (CT_F_SPORT), else 0 */
	__u16 half;                /* ct_put_flow: a half-open flow's (its
				    * ingress entry alone) */
	struct ct_tuple svc_key;   /* ct_create_flow: the new flow's service entry */
	struct ct_tuple half_key;  /* ct_put_flow: the new flow's ingress entry */
	struct ct_tuple tuple3;    /* snat_claim: the keys of a mapping it takes over */
	struct snat_scan scan;     /* snat_scan */
	struct ct_tuple retire_svc; /* ct_retire: the closed flow's service entry, */
	struct ct_tuple retire_in;  /* and its ingress entry */
	__u32 in_est;              /* ct_clash_sport: the new flow's ingress tuple
				    * is in the established table (ct_put_flow
				    * need not look again) */
	__u32 in_seen;             /* ct_clash_sport: it is in either table (0:
				    * no flow of that tuple, snat_egress need
				    * not look for its egress mapping) */
	__s32 half_idx;            /* ct_clash_sport: its slot of ct_half (-1:
				    * unknown), for ct_put_flow and ct_note_snat */
	__u32 in_half;             /* ct_clash_sport: that slot holds it (1:
				    * unknown), which ct_put empties when it
				    * writes the entry elsewhere */
	__u32 in_new;              /* ct_clash_sport: it is in ct_new itself
				    * (1: unknown), whose entry a half-open
				    * flow written to its slot deletes */
	__u32 claim_fresh;         /* snat_claim's arguments: the flow's table */
	__u32 claim_now;           /* (SNAT_CLAIM_*) and the CT second */
	__u64 claim_word;          /* snat_claim, snat_hold: the word of the
				    * mapping found (nat_word) */
	__u64 hold_word;           /* snat_hold: the word it wants */
	__u32 claim_hash;          /* snat_try_claim: tuple2's half_hash */
	__u32 taken_hash;          /* snat_port_free: tuple3's */
	__u64 claim_fence;         /* snat_claim_fence's word */
	struct dsr_scratch dsr;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ct_scratch);
	__uint(max_entries, 1);
} ns_scratch_map SEC(".maps");

static __always_inline struct ct_scratch *ns_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&ns_scratch_map, &zero);
}

/* ns_fib_buf is the scratch's FIB lookup buffer: 64 bytes the service
 * path's frame does not hold (struct bpf_fib_lookup, whole: the helper
 * takes its size). */
static __always_inline struct bpf_fib_lookup *ns_fib_buf(void)
{
	struct ct_scratch *s = ns_scratch();

	return s ? &s->fib : NULL;
}

#endif /* __SLUICE_NS_MAPS_H */
