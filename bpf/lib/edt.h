/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Pod bandwidth on the Earliest Departure Time clock (the bandwidth manager).
 *
 * A limited Pod is an aggregate: an id (1..65535) and, per direction, a
 * rate and the departure time of its last packet. A packet of len wire
 * bytes departs len / rate after the one before it, and at once after an
 * idle period (as Cilium's edt_sched_departure):
 *
 *   stamp   (EDT: fq on the device enforces it)  skb->tstamp = departure;
 *           departing horizon_ns (2 s) after now or later: dropped; a
 *           small packet charged the same but sent up to 4 bursts sooner,
 *           after its flow's larger ones (bw_flow_departure)
 *   police  (no fq, or a hook fq is not behind)  nothing waits: starting
 *           burst_ns (a few ms) after now or later: dropped (a GSO packet
 *           holds the wire for long: judged by its start, it is not
 *           dropped for its size alone)
 *
 * and either marks an ECN-capable packet CE when it departs ecn_ns after
 * now or later. Stamping and policing of one aggregate share its clock.
 *
 * A dropped packet does not move the clock. The Pod is found by the
 * host-side veth its packets came in by (skb->skb_iif, kept through
 * forwarding, so the device's egress needs no mark) or, for sockets, by
 * the Pod's address. The agent writes the limits and creates the state
 * entries; the programs read the limits and move the state.
 */
#ifndef __SLUICE_EDT_H
#define __SLUICE_EDT_H

#include <stdbool.h>
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif /* __always_inline */
#ifndef READ_ONCE
#define READ_ONCE(x) (*(const volatile typeof(x) *)&(x))
#endif /* READ_ONCE */
#ifndef WRITE_ONCE
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#endif /* WRITE_ONCE */
#ifndef NSEC_PER_SEC
#define NSEC_PER_SEC 1000000000ULL
#endif /* NSEC_PER_SEC */

/* Directions of an aggregate. */
#define BW_DIR_EGRESS  0 /* from the Pod: kubernetes.io/egress-bandwidth */
#define BW_DIR_INGRESS 1 /* to the Pod: kubernetes.io/ingress-bandwidth */

/* What the tc programs do with a Pod's egress (bw_mode, set at load). */
#define BW_MODE_EDT    1 /* stamp on the devices (fq there), police same-node traffic */
#define BW_MODE_POLICE 2 /* police on the Pod's veth (the kernel has no fq) */

/* Returned to let the next program of the hook (tcx) or filter (clsact)
 * decide: TCX_NEXT and TC_ACT_UNSPEC are both -1. */
#define BW_NEXT (-1)
#define BW_DROP 2 /* TC_ACT_SHOT */

struct bw_key {
	__u32 id;  /* the Pod's aggregate */
	__u32 dir; /* BW_DIR_* */
};

/* Written by the agent. */
struct bw_limit {
	__u64 bps;        /* wire bytes per second; 0: not limited */
	__u64 horizon_ns; /* stamped departures this far after now or later are dropped */
	__u64 burst_ns;   /* policed ones this far after now or later are dropped */
	__u64 ecn_ns;     /* either this far after now or later is marked CE when ECN-capable; 0: never */
};

/* Created zeroed by the agent, moved by the programs. */
struct bw_state {
	__u64 t_last;    /* departure of the last packet, bpf_ktime_get_ns() */
	__u64 packets;   /* passed */
	__u64 bytes;     /* wire bytes passed */
	__u64 drops;     /* beyond drop_ns */
	__u64 marks;     /* marked CE */
	__u64 act_epoch; /* sockets: the window act_cur counts */
	__u32 act_cur;   /* sockets that sent half their share or more in window act_epoch */
	__u32 act_prev;  /* ... in the window before it */
	__u64 thin_cur;  /* wire bytes per window the other (thin) sockets sent, as of act_epoch */
	__u64 thin_prev; /* ... in the window before it */
};

/* A flow of an aggregate, by its skb hash (fq's flow for a packet without
 * a local socket, as forwarded ones are). */
struct bw_flow_key {
	__u32 id;   /* the Pod's aggregate */
	__u32 dir;  /* BW_DIR_* */
	__u32 hash; /* skb->hash */
	__u32 pad;
};

/* A Pod's address, for its sockets. */
struct bw_addr_val {
	__u32 id;    /* its aggregate; 0: not limited */
	__u32 flags; /* none yet */
};

/* (aggregate, direction) -> limit. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct bw_key);
	__type(value, struct bw_limit);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_limits SEC(".maps");

/* (aggregate, direction) -> clock and counters. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct bw_key);
	__type(value, struct bw_state);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_state SEC(".maps");

/* Host-side veth ifindex (host order) -> the Pod's aggregate. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_ifindex SEC(".maps");

/* A Pod's address (16 bytes, IPv4 v4-mapped, network order) -> its
 * aggregate, for the socket hooks. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u8[16]);
	__type(value, struct bw_addr_val);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_addr SEC(".maps");

/* (aggregate, direction, flow) -> the departure of the flow's last packet
 * of more than BW_SMALL_LEN wire bytes stamped ahead (bw_stamp): a small
 * packet of the flow never departs before it. Least recently used flows
 * make room; a flow lost that way loses only that order. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct bw_flow_key);
	__type(value, __u64);
	__uint(max_entries, 16384);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_flows SEC(".maps");

/* bw_depart returns when a packet of len wire bytes, arriving at now and
 * not to leave before t_min (its skb->tstamp, or 0), departs; 0 when that
 * is drop_ns after now or later (by_start: when it starts, i.e. departs
 * drop_ns plus its own delay after now or later): the packet is dropped
 * and the clock does not move. */
static __always_inline __u64 bw_depart(struct bw_state *st, const struct bw_limit *lim,
				       __u64 len, __u64 now, __u64 t_min, __u64 drop_ns, bool by_start)
{
	__u64 t = t_min > now ? t_min : now;
	__u64 delay, t_next;

	if (!lim->bps)
		return t;
	delay = len * NSEC_PER_SEC / lim->bps;
	t_next = READ_ONCE(st->t_last) + delay;
	if (t_next <= t) {
		WRITE_ONCE(st->t_last, t);
		return t;
	}
	if (by_start)
		drop_ns += delay;
	if (t_next - now >= drop_ns)
		return 0;
	WRITE_ONCE(st->t_last, t_next);
	return t_next;
}

/* bw_mark_ce marks an ECN-capable IPv4 or IPv6 packet Congestion
 * Experienced and reports whether it is marked now. */
static __always_inline bool bw_mark_ce(struct __sk_buff *ctx)
{
	__u8 b[2];

	if (bpf_skb_load_bytes(ctx, ETH_HLEN, b, sizeof(b)) < 0)
		return false;
	if (ctx->protocol == bpf_htons(ETH_P_IP)) {
		__u16 old, new;

		if ((b[1] & 3) == 0) /* Not-ECT */
			return false;
		if ((b[1] & 3) == 3)
			return true;
		__builtin_memcpy(&old, b, 2);
		b[1] |= 3;
		__builtin_memcpy(&new, b, 2);
		/* The header's sum stays the same, so a CHECKSUM_COMPLETE
		 * skb->csum stays right too. */
		if (bpf_l3_csum_replace(ctx, ETH_HLEN + offsetof(struct iphdr, check), old, new, 2) < 0)
			return false;
		return bpf_skb_store_bytes(ctx, ETH_HLEN, b, 2, 0) == 0;
	}
	if (ctx->protocol == bpf_htons(ETH_P_IPV6)) {
		/* Traffic class bits 0-1 are bits 4-5 of the second byte. */
		if ((b[1] & 0x30) == 0)
			return false;
		if ((b[1] & 0x30) == 0x30)
			return true;
		b[1] |= 0x30;
		return bpf_skb_store_bytes(ctx, ETH_HLEN, b, 2, BPF_F_RECOMPUTE_CSUM) == 0;
	}
	return false;
}

/* bw_hdr_len is the length of the headers a GSO packet repeats on every
 * segment: Ethernet, IP and TCP or UDP; 0 when it cannot tell. */
static __always_inline __u32 bw_hdr_len(struct __sk_buff *ctx)
{
	__u32 l3 = ETH_HLEN, l4;
	__u8 proto, b;

	if (ctx->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(ctx, l3, &b, 1) < 0)
			return 0;
		l4 = l3 + (b & 0xf) * 4;
		if (bpf_skb_load_bytes(ctx, l3 + offsetof(struct iphdr, protocol), &proto, 1) < 0)
			return 0;
	} else if (ctx->protocol == bpf_htons(ETH_P_IPV6)) {
		l4 = l3 + sizeof(struct ipv6hdr);
		if (bpf_skb_load_bytes(ctx, l3 + offsetof(struct ipv6hdr, nexthdr), &proto, 1) < 0)
			return 0;
	} else {
		return 0;
	}
	if (proto == IPPROTO_UDP)
		return l4 + sizeof(struct udphdr);
	if (proto != IPPROTO_TCP)
		return 0;
	/* doff is the high nibble of byte 12. */
	if (bpf_skb_load_bytes(ctx, l4 + 12, &b, 1) < 0)
		return 0;
	return l4 + (b >> 4) * 4;
}

/* bw_wire_len is the bytes the packet puts on the wire, headers of every
 * GSO segment included. At egress the stack has counted them
 * (qdisc_pkt_len_init); at ingress only skb->len is known. */
static __always_inline __u64 bw_wire_len(struct __sk_buff *ctx, bool egress)
{
	__u32 segs = ctx->gso_segs;

	if (egress && ctx->wire_len)
		return ctx->wire_len;
	if (segs <= 1)
		return ctx->len;
	return ctx->len + (__u64)(segs - 1) * bw_hdr_len(ctx);
}

static __always_inline struct bw_state *bw_lookup(__u32 id, __u32 dir, struct bw_limit **lim)
{
	struct bw_key key = { .id = id, .dir = dir };

	*lim = bpf_map_lookup_elem(&bw_limits, &key);
	if (!*lim || !(*lim)->bps)
		return NULL;
	return bpf_map_lookup_elem(&bw_state, &key);
}

static __always_inline void bw_count_pass(struct bw_state *st, __u64 len)
{
	__sync_fetch_and_add(&st->packets, 1);
	__sync_fetch_and_add(&st->bytes, len);
}

/* The sockets' window (sock_edt.c counts a Pod's sending sockets in it):
 * 2^27 ns, about 134 ms. */
#define BW_WINDOW_SHIFT 27

/* bw_of_windows reads a count of the Pod's sockets (cur of its window e,
 * prev of the one before) as of window epoch: the larger of the two while
 * e is epoch (or epoch + 1: rolled by a CPU whose clock read later), cur
 * alone when e is the window before epoch, none when e is older (the
 * Pod's sockets stopped sending since). */
static __always_inline __u64 bw_of_windows(__u64 e, __u64 epoch, __u64 cur, __u64 prev)
{
	if (e == epoch || e == epoch + 1)
		return cur > prev ? cur : prev;
	if (e + 1 == epoch)
		return cur;
	return 0;
}

/* bw_sending is how many of the Pod's sockets were counted sending
 * (sock_edt.c) as of window epoch, e being the st->act_epoch read with
 * whatever else the caller reads of the windows. sock_edt.c's bw_dec keeps
 * the counts at zero or above; one below zero (an agent before it) reads
 * as none. */
static __always_inline __u64 bw_sending(const struct bw_state *st, __u64 e, __u64 epoch)
{
	__s32 cur = READ_ONCE(st->act_cur), prev = READ_ONCE(st->act_prev);

	return bw_of_windows(e, epoch, cur > 0 ? cur : 0, prev > 0 ? prev : 0);
}

/* Under the policer a Pod's TCP sockets that fill their shares are paced
 * each on its own (sock_edt.c), and each sends TSO packets of two full
 * frames at least (the agent sizes them to the pacing rate where the rate
 * is low: podnetns.go). Their packets reach the policer at independent
 * times, now and then one of each at once: a burst shorter than that
 * drops the late ones although the Pod keeps to its rate (8 BBR streams
 * at 10 Mbit/s lost 3-8% of it to the retransmissions: BBR does not slow
 * for the CE marks before the drop). So a Pod's egress burst is two
 * frames for each socket counted sending in this window or the last, when
 * that is longer, up to BW_BURST_MAX times the limit's. It lets the Pod
 * send that far ahead of its clock, never more than its rate over time. */
#define BW_FRAME_BYTES 1514
#define BW_BURST_MAX   4

static __always_inline __u64 bw_egress_burst(const struct bw_state *st, const struct bw_limit *lim,
					     __u64 now)
{
	__u64 burst = lim->burst_ns, b, n = bw_sending(st, READ_ONCE(st->act_epoch), now >> BW_WINDOW_SHIFT);

	if (n < 2)
		return burst;
	if (n > 0xffff)
		n = 0xffff;
	b = n * 2 * BW_FRAME_BYTES * NSEC_PER_SEC / lim->bps;
	if (b > burst * BW_BURST_MAX)
		b = burst * BW_BURST_MAX;
	return b > burst ? b : burst;
}

/* Policed packets of at most BW_SMALL_LEN wire bytes are dropped only
 * BW_SMALL_BURST times later than the burst (bw_police). */
#define BW_SMALL_LEN   256
#define BW_SMALL_BURST 4

/* bw_police passes or drops a packet of aggregate id in direction dir at a
 * hook where it cannot wait, marking it CE on the way when it departs late. */
static __always_inline int bw_police(struct __sk_buff *ctx, __u32 id, __u32 dir, __u64 len)
{
	struct bw_limit *lim;
	struct bw_state *st = bw_lookup(id, dir, &lim);
	__u64 now, t, burst;

	if (!st)
		return BW_NEXT;
	now = bpf_ktime_get_ns();
	burst = dir == BW_DIR_EGRESS ? bw_egress_burst(st, lim, now) : lim->burst_ns;
	/* A small packet (an ACK, a request) gets BW_SMALL_BURST times the
	 * burst: it carries little of the rate and much of the latency, and
	 * one dropped costs its flow a retransmission timeout. */
	t = bw_depart(st, lim, len, now, 0, len <= BW_SMALL_LEN ? lim->burst_ns * BW_SMALL_BURST : burst, true);
	if (!t) {
		__sync_fetch_and_add(&st->drops, 1);
		return BW_DROP;
	}
	if (lim->ecn_ns && t - now >= lim->ecn_ns && bw_mark_ce(ctx))
		__sync_fetch_and_add(&st->marks, 1);
	bw_count_pass(st, len);
	return BW_NEXT;
}

/* bw_flow_departure is when a packet of len wire bytes that the
 * aggregate's clock sends at t, and that may not leave before base (now,
 * or its skb->tstamp), departs in its flow. A packet of more than
 * BW_SMALL_LEN bytes departs at t, and its flow remembers t. A small one
 * (a request, an ACK) is charged to the clock all the same but departs up
 * to lead before t, never before the flow's last larger packet: behind
 * a Pod's bulk transfer its requests wait for no more than the bulk's
 * queue beyond lead, and fq (a flow of its own) sends them on; its flow's
 * order is kept, and over time the Pod keeps to its rate (a flood of small
 * packets departs lead ahead of the clock, at the rate). */
static __always_inline __u64 bw_flow_departure(struct __sk_buff *ctx, __u32 id, __u32 dir, __u64 len,
					       __u64 base, __u64 t, __u64 lead)
{
	struct bw_flow_key key = { .id = id, .dir = dir };
	__u64 *last, at;

	if (t <= base)
		return t;
	key.hash = bpf_get_hash_recalc(ctx);
	last = bpf_map_lookup_elem(&bw_flows, &key);
	if (len > BW_SMALL_LEN) {
		if (last)
			WRITE_ONCE(*last, t);
		else
			bpf_map_update_elem(&bw_flows, &key, &t, BPF_ANY);
		return t;
	}
	at = t - base > lead ? t - lead : base;
	if (last && READ_ONCE(*last) > at)
		at = READ_ONCE(*last);
	return at;
}

/* bw_stamp gives a packet of aggregate id its departure time, for fq: the
 * clock's, or for a small packet up to BW_SMALL_BURST bursts before it
 * (bw_flow_departure), as the policer lets small packets start that far
 * into the rate. CE marks follow the clock: they tell of the Pod's queue. */
static __always_inline int bw_stamp(struct __sk_buff *ctx, __u32 id, __u32 dir, __u64 len)
{
	struct bw_limit *lim;
	struct bw_state *st = bw_lookup(id, dir, &lim);
	__u64 now, base, t, at;

	if (!st)
		return BW_NEXT;
	now = bpf_ktime_get_ns();
	base = ctx->tstamp > now ? ctx->tstamp : now;
	t = bw_depart(st, lim, len, now, ctx->tstamp, lim->horizon_ns, false);
	if (!t) {
		__sync_fetch_and_add(&st->drops, 1);
		return BW_DROP;
	}
	at = bw_flow_departure(ctx, id, dir, len, base, t, lim->burst_ns * BW_SMALL_BURST);
	if (at > now)
		ctx->tstamp = at;
	if (t > now && lim->ecn_ns && t - now >= lim->ecn_ns && bw_mark_ce(ctx))
		__sync_fetch_and_add(&st->marks, 1);
	bw_count_pass(st, len);
	return BW_NEXT;
}

/* bw_count counts a packet of aggregate id in direction dir that a qdisc
 * holds to the rate (TBF on a veth). */
static __always_inline int bw_count(__u32 id, __u32 dir, __u64 len)
{
	struct bw_limit *lim;
	struct bw_state *st = bw_lookup(id, dir, &lim);

	if (st)
		bw_count_pass(st, len);
	return BW_NEXT;
}

/* bw_aggregate is the aggregate of the Pod behind host-side veth ifindex,
 * 0 when it has none. */
static __always_inline __u32 bw_aggregate(__u32 ifindex)
{
	__u32 *id;

	if (!ifindex)
		return 0;
	id = bpf_map_lookup_elem(&bw_ifindex, &ifindex);
	return id ? *id : 0;
}

#endif /* __SLUICE_EDT_H */
