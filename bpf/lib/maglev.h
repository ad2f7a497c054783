/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maglev backend selection for north-south traffic (tc and XDP).
 *
 * The agent computes one lookup table per frontend that has SVC_F_MAGLEV
 * (internal/maglev) and swaps it in whole. A flow's entry is
 * lb_maglev_flow_hash() % table size: the hash is the same on every node,
 * unlike the kernel's per-boot skb hash, so a flow reaching any node for the
 * same frontend lands on the same backend. Go mirrors the hash in
 * maglev.FlowHash; the socket LB keeps random selection.
 */
#ifndef __SLUICE_MAGLEV_H
#define __SLUICE_MAGLEV_H

#include "common.h"

/* Set by the agent before load (lbmap.ConfigureMaglev); the inner map
 * template's max_entries is set to the same size. */
volatile const __u32 lb_maglev_table_size = 16381;
volatile const __u32 lb_maglev_hash_seed = 0;

/* One table: entry (host order) -> backend ID (host order). */
struct lb_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 16381);
};

/* rev_nat_id (host order) -> the frontend's table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u16);
	__type(value, __u32);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct lb_maglev_inner);
} lb_maglev SEC(".maps");

static __always_inline __u32 lb_maglev_round(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

/* MurmurHash3_x86_32 over (saddr, daddr, sport, dport, proto): addresses as
 * the maps store them (v4-mapped), ports in network order, 40 bytes. */
static __always_inline __u32
lb_maglev_flow_hash(const union lb_addr *saddr, const union lb_addr *daddr,
		    __be16 sport, __be16 dport, __u8 proto)
{
	__u32 h = lb_maglev_hash_seed;
	int i;

	/* Rolled loops (bounded loops, 5.3+): unrolled, clang loads all eight
	 * words up front and spills them, 128 bytes of stack the service
	 * path does not have. */
#pragma clang loop unroll(disable)
	for (i = 0; i < 4; i++)
		h = lb_maglev_round(h, saddr->w[i]);
#pragma clang loop unroll(disable)
	for (i = 0; i < 4; i++)
		h = lb_maglev_round(h, daddr->w[i]);
	/* The two ports as one word, as it lies in memory. */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	h = lb_maglev_round(h, (__u32)sport | (__u32)dport << 16);
#else
	h = lb_maglev_round(h, (__u32)sport << 16 | (__u32)dport);
#endif /* __BYTE_ORDER__ */
	h = lb_maglev_round(h, proto);

	return hash_fmix32(h ^ 40);
}

/* The backend ID for a flow hash in the frontend's table; 0 when the
 * frontend has no table (the caller falls back to its slots). */
static __always_inline __u32 lb_maglev_backend(__u16 rev_nat_id, __u32 hash)
{
	__u32 size = lb_maglev_table_size;
	__u32 idx, *id;
	void *table;

	if (!size)
		return 0;
	table = bpf_map_lookup_elem(&lb_maglev, &rev_nat_id);
	if (!table)
		return 0;
	idx = hash % size;
	id = bpf_map_lookup_elem(table, &idx);
	return id ? *id : 0;
}

#endif /* __SLUICE_MAGLEV_H */
