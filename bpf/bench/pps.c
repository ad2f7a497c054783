// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Helper programs of `sluice bench pps`, never used by the agent.
 *
 *   xdp_pps_gen       traffic generator, run with BPF_PROG_RUN and
 *                     BPF_F_TEST_XDP_LIVE_FRAMES: writes the frame's headers
 *                     from the template, varies the UDP source port over
 *                     `flows` flows, and returns XDP_TX
 *   xdp_pps_gen_win   the same with at most `window` frames in flight,
 *                     for `--node-cpu`: the node's NAPI thread on another
 *                     CPU gets frames as fast as it takes them, none lost
 *   xdp_pps_restore   the same header write, then a tail call into the
 *   tc_pps_restore    program under test (pps_target[0]): lets BPF_PROG_RUN
 *                     repeat a program that rewrites the packet, since the
 *                     kernel does not reset the data between repeats
 *   xdp_pps_sink      counts packets per CPU and drops them
 *   xdp_pps_pass      XDP_PASS: gives a veth NAPI, so that frames sent to
 *                     it by XDP_TX or redirect are received; with
 *   tc_pps_pass       TC_ACT_OK, the tail-call targets that measure the
 *                     restore + tail call overhead that is subtracted
 */
#include <stdbool.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Ethernet + IPv4 (no options) + UDP. */
#define PPS_HDR_LEN 42
#define PPS_SPORT_OFF 34
#define PPS_UCSUM_OFF 40

/* The headers of the frame, set by the loader (checksums included, for
 * source port base_sport), and how many source ports to cycle through. */
volatile const __u8 pps_tmpl[PPS_HDR_LEN];
volatile const __u16 base_sport = 10000;
volatile const __u32 flows = 1;

/* Per-CPU packet sequence of the generator (source port choice). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} pps_seq SEC(".maps");

/* Per-CPU count of packets the sink received. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pps_count SEC(".maps");

/* The XDP program under test, for xdp_pps_restore. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} pps_xdp_target SEC(".maps");

/* The tc program under test, for tc_pps_restore. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} pps_tc_target SEC(".maps");

/* pps_next_header fills hdr from the template with the next flow's source
 * port and a UDP checksum adjusted for it (RFC 1624). */
static __always_inline void pps_next_header(__u8 *hdr)
{
	__u32 key = 0, *seq, n = 0, sum;
	__u16 sport, old, csum;
	int i;

	seq = bpf_map_lookup_elem(&pps_seq, &key);
	if (seq) {
		n = *seq;
		*seq = n + 1;
	}
#pragma unroll
	for (i = 0; i < PPS_HDR_LEN; i++)
		hdr[i] = pps_tmpl[i];
	if (flows <= 1)
		return;
	sport = bpf_htons(base_sport + (__u16)(n % flows));
	__builtin_memcpy(&old, hdr + PPS_SPORT_OFF, 2);
	__builtin_memcpy(&csum, hdr + PPS_UCSUM_OFF, 2);
	__builtin_memcpy(hdr + PPS_SPORT_OFF, &sport, 2);
	if (!csum)
		return; /* no UDP checksum: nothing to adjust */
	sum = (__u16)~csum + (__u16)~old + sport;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	csum = ~sum;
	if (!csum)
		csum = 0xffff;
	__builtin_memcpy(hdr + PPS_UCSUM_OFF, &csum, 2);
}

/* xdp_write_header rewrites the frame's headers; a frame from the live
 * frames page pool may hold what the device under test made of it. */
static __always_inline int xdp_write_header(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (data + PPS_HDR_LEN > data_end)
		return -1;
	pps_next_header(data);
	return 0;
}

SEC("xdp")
int xdp_pps_gen(struct xdp_md *ctx)
{
	if (xdp_write_header(ctx))
		return XDP_ABORTED;
	return XDP_TX;
}

volatile const __u32 node_cpu;

/* Flow control for --node-cpu with threaded NAPI: the generator keeps at
 * most `window` frames between itself and the sink, fewer than a veth ring
 * (256) and the live frames page pool's ring (the batch size) hold, so no
 * frame is lost and every page comes back to the pool. Over the window it
 * returns XDP_DROP (nothing sent, the page recycled at once) until the
 * sink, on node_cpu, catches up. Frames that never arrive (dropped on the
 * way) would close the window for good: when the sink's count has not
 * moved for stall_ns, the frames in flight count as lost. */
volatile const __u32 window = 192;
volatile const __u64 stall_ns = 100 * 1000 * 1000;

struct pps_win {
	__u64 sent;     /* frames sent, from the sink's count at the start */
	__u64 lost;     /* frames given up on */
	__u64 seen;     /* the sink's count when last looked at */
	__u64 seen_at;  /* and when it last moved (ktime ns) */
};

/* The generator's state, written by the loader before each run and then
 * only by the generator's CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pps_win);
} pps_win SEC(".maps");

SEC("xdp")
int xdp_pps_gen_win(struct xdp_md *ctx)
{
	struct pps_win *w;
	__u32 key = 0;
	__u64 *sunk, now;

	w = bpf_map_lookup_elem(&pps_win, &key);
	sunk = bpf_map_lookup_percpu_elem(&pps_count, &key, node_cpu);
	if (!w || !sunk)
		return XDP_ABORTED;
	/* Frames given up on that arrived after all: not lost. */
	if ((__s64)(w->sent - w->lost - *sunk) < 0)
		w->lost = w->sent - *sunk;
	if ((__s64)(w->sent - w->lost - *sunk) >= window) {
		now = bpf_ktime_get_ns();
		if (*sunk != w->seen) {
			w->seen = *sunk;
			w->seen_at = now;
		} else if (now - w->seen_at > stall_ns) {
			w->lost = w->sent - *sunk;
			w->seen_at = now;
		}
		return XDP_DROP;
	}
	if (xdp_write_header(ctx))
		return XDP_ABORTED;
	w->sent++;
	return XDP_TX;
}

SEC("xdp")
int xdp_pps_restore(struct xdp_md *ctx)
{
	if (xdp_write_header(ctx))
		return XDP_ABORTED;
	bpf_tail_call(ctx, &pps_xdp_target, 0);
	return XDP_ABORTED;
}

SEC("tc")
int tc_pps_restore(struct __sk_buff *skb)
{
	__u8 hdr[PPS_HDR_LEN];

	pps_next_header(hdr);
	if (bpf_skb_store_bytes(skb, 0, hdr, PPS_HDR_LEN, 0))
		return TC_ACT_SHOT;
	bpf_tail_call(skb, &pps_tc_target, 0);
	return TC_ACT_SHOT;
}

SEC("xdp")
int xdp_pps_sink(struct xdp_md *ctx)
{
	__u32 key = 0;
	__u64 *n = bpf_map_lookup_elem(&pps_count, &key);

	if (n)
		*n += 1;
	return XDP_DROP;
}

SEC("xdp")
int xdp_pps_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("tc")
int tc_pps_pass(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
