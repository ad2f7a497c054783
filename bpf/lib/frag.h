/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IP fragments of north-south flows. Only the first fragment of a datagram
 * carries its L4 header; the later ones, IPv4 and IPv6 alike, have the IP
 * header alone, so no ports to find a Service or a flow by. The first
 * fragment's ports are kept, keyed by what every fragment of the datagram
 * carries, (source, destination, ID, protocol), and the later ones take
 * them from there (the idea of Cilium's fragment map):
 *
 *   first fragment   ports parsed, kept in ns_frag; translated as any packet
 *   later fragment   ports from ns_frag; translated at L3 only (addresses,
 *                    IPv4 header checksum): the L4 checksum is in the first
 *                    fragment and covers the whole datagram, which the
 *                    first fragment's translation kept right
 *   later, unknown   its first fragment not seen (it is late: reordered on
 *                    the way) or evicted: to the stack untouched, since it
 *                    may be the host's own traffic; a Service's datagram is
 *                    then lost, as a datagram missing a fragment is (Cilium
 *                    drops such a fragment). BPF cannot hold a packet until
 *                    its first fragment comes.
 *
 * Entries are not removed by the last fragment (fragments may come in any
 * order after the first): the LRU map evicts them, sized from memory by
 * the agent (docs/maps.md). A translated datagram keeps its ID: SNATed
 * datagrams of two clients with the same ID to the same backend could be
 * mixed up by the backend's reassembly, as behind any NAT that keeps IDs
 * (Linux's own masquerading does too).
 */
#ifndef __SLUICE_FRAG_H
#define __SLUICE_FRAG_H

#include "common.h"
#include "ct_abi.h"

/* (source, destination, ID, protocol) of a datagram -> its ports, kept by
 * its first fragment. Addresses v4-mapped for IPv4; ports network order.
 * max_entries is set at load (the agent sizes it from memory). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ns_frag_key);
	__type(value, struct ns_frag_ports);
	__uint(max_entries, 8192);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ns_frag SEC(".maps");

/* Per-CPU room for the key and value: parsing runs in the service path's
 * frame, which has no 44 bytes to spare (the stack budget: ns_maps.h). */
struct ns_frag_buf {
	struct ns_frag_key key;
	struct ns_frag_ports ports;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct ns_frag_buf);
	__uint(max_entries, 1);
} ns_frag_scratch SEC(".maps");

/* frag_ports keeps the ports of a datagram's first fragment (first), or
 * finds them for a later one. It returns 0, or -1 when a later fragment's
 * first is not known. */
static __always_inline int frag_ports(const union lb_addr *saddr, const union lb_addr *daddr,
				      __be32 id, __u8 proto, __be16 *sport, __be16 *dport,
				      bool first)
{
	const struct ns_frag_ports *v;
	struct ns_frag_buf *b;
	__u32 zero = 0;

	b = bpf_map_lookup_elem(&ns_frag_scratch, &zero);
	if (!b)
		return -1;
	__builtin_memcpy(b->key.saddr, saddr->b, sizeof(b->key.saddr));
	__builtin_memcpy(b->key.daddr, daddr->b, sizeof(b->key.daddr));
	b->key.id = id;
	b->key.proto = proto;
	b->key.pad[0] = b->key.pad[1] = b->key.pad[2] = 0;
	if (first) {
		b->ports.sport = *sport;
		b->ports.dport = *dport;
		/* A map full of live datagrams evicts the oldest (LRU): a lost
		 * update costs that datagram only. */
		bpf_map_update_elem(&ns_frag, &b->key, &b->ports, BPF_ANY);
		return 0;
	}
	v = bpf_map_lookup_elem(&ns_frag, &b->key);
	if (!v)
		return -1;
	*sport = v->sport;
	*dport = v->dport;
	return 0;
}

#endif /* __SLUICE_FRAG_H */
