// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Helper programs of `sluice bench pps`, never used by the agent.
 *
 *   xdp_pps_gen       traffic generator, run with BPF_PROG_RUN and
 *                     BPF_F_TEST_XDP_LIVE_FRAMES: writes the frame's headers
 *                     from the template, varies the UDP source port over
 *                     `flows` flows, and returns XDP_TX (with gen_shape:
 *                     the frames of a `sluice lab flood --shape`)
 *   xdp_pps_gen_win   the same with at most `window` frames in flight,
 *                     for `--node-cpu`: the node's NAPI thread on another
 *                     CPU gets frames as fast as it takes them, none lost
 *   xdp_pps_restore   the same header write, then a tail call into the
 *   tc_pps_restore    program under test (pps_target[0]): lets BPF_PROG_RUN
 *                     repeat a program that rewrites the packet, since the
 *                     kernel does not reset the data between repeats
 *                     (with gen_syn: every frame a TCP SYN of a new flow, the
 *                     source address and port counting up: --new-flows)
 *   xdp_pps_sink      counts packets per CPU and drops them
 *   xdp_pps_sink_to   the same for frames to the forwarding's next hop only
 *   tc_pps_sink_pod   the lab mode's: at a backend pod's tc ingress, counts
 *                     and drops the packets to it, passes the rest (ARP)
 *   xdp_pps_fwd       the forwarding ceiling: a bare XDP forwarder that
 *                     rewrites addresses and the port the way the node's
 *                     translation would (checksums updated), with no lookup
 *                     at all, and sends with XDP_TX (or redirect)
 *   xdp_pps_fwd_local the local delivery's ceiling: the forwarder's DNAT
 *                     alone, then XDP_PASS to the stack
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
 * source port base_sport), and how many source ports to cycle through.
 * Aligned, so that the generator copies it a word at a time. */
volatile const __u8 pps_tmpl[PPS_HDR_LEN] __attribute__((aligned(8)));
volatile const __u16 base_sport = 10000;
volatile const __u32 flows = 1;

/* --new-flows: every frame a TCP SYN (Ethernet + IPv4 + TCP, no options)
 * from the template syn_tmpl (checksums for packet 0), whose source port
 * counts up from 1024 over 32768 ports and then the address from syn_saddr
 * (host order) over a /16: 2^31 flows before one repeats. Port first, as a
 * spoofed flood's ports spread: a kernel masquerading every flow to one
 * backend keeps each one's port then, instead of searching for a free one
 * each time. */
#define PPS_SYN_LEN   54
#define PPS_SADDR_OFF 26
#define PPS_ICSUM_OFF 24
#define PPS_TCSUM_OFF 50
volatile const __u8 gen_syn;
volatile const __u8 syn_tmpl[56] __attribute__((aligned(8)));
volatile const __u32 syn_saddr;

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
 * port and a UDP checksum adjusted for it (RFC 1624). The generator's own
 * cost per frame lands on the CPU it shares with the node (one CPU), so it
 * is kept small: the template goes in five 64-bit words and a 16-bit one,
 * not 42 bytes one by one, and the flow counter wraps instead of taking a
 * division. x86 and arm64 store to unaligned packet data at full speed, and
 * the verifier checks packet alignment only when asked to be strict. */
static __always_inline void pps_next_header(__u8 *hdr)
{
	const volatile __u64 *src = (const volatile __u64 *)pps_tmpl;
	__u64 *dst = __builtin_assume_aligned(hdr, 8);
	__u32 key = 0, *seq, n = 0, sum;
	__u16 sport, old, csum;
	int i;

	seq = bpf_map_lookup_elem(&pps_seq, &key);
	if (seq) {
		n = *seq;
		*seq = n + 1 < flows ? n + 1 : 0;
	}
#pragma unroll
	for (i = 0; i < PPS_HDR_LEN / 8; i++)
		dst[i] = src[i];
	*(__u16 *)&dst[i] = *(const volatile __u16 *)&src[i];
	if (flows <= 1)
		return;
	sport = bpf_htons(base_sport + (__u16)n);
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

/* csum_move folds into a checksum (network order) the change of a 16-bit
 * word from old to new (RFC 1624: HC' = ~(~HC + ~m + m')). */
static __always_inline __u16 csum_move(__u16 csum, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~csum + (__u16)~old + new;

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* csum_move32 is csum_move for a 32-bit field, word by word. */
static __always_inline __u16 csum_move32(__u16 csum, __u32 old, __u32 new)
{
	csum = csum_move(csum, old >> 16, new >> 16);
	return csum_move(csum, old & 0xffff, new & 0xffff);
}

/* pps_next_syn fills hdr from syn_tmpl with the next new flow's source
 * address and port, both checksums adjusted for them. */
static __always_inline void pps_next_syn(__u8 *hdr)
{
	const volatile __u64 *src = (const volatile __u64 *)syn_tmpl;
	__u64 *dst = __builtin_assume_aligned(hdr, 8);
	__u32 key = 0, *seq, n = 0, saddr, old_saddr;
	__u16 sport, old_sport, icsum, tcsum;
	int i;

	seq = bpf_map_lookup_elem(&pps_seq, &key);
	if (seq) {
		n = *seq;
		*seq = n + 1;
	}
#pragma unroll
	for (i = 0; i < PPS_SYN_LEN / 8; i++)
		dst[i] = src[i];
	*(__u32 *)&dst[i] = *(const volatile __u32 *)&src[i];
	*((__u16 *)&dst[i] + 2) = *((const volatile __u16 *)&src[i] + 2);
	if (n == 0)
		return;
	saddr = bpf_htonl(syn_saddr + ((n >> 15) & 0xffff));
	sport = bpf_htons(1024 + (n & 0x7fff));
	__builtin_memcpy(&old_saddr, hdr + PPS_SADDR_OFF, 4);
	__builtin_memcpy(&old_sport, hdr + PPS_SPORT_OFF, 2);
	__builtin_memcpy(&icsum, hdr + PPS_ICSUM_OFF, 2);
	__builtin_memcpy(&tcsum, hdr + PPS_TCSUM_OFF, 2);
	icsum = csum_move32(icsum, old_saddr, saddr);
	tcsum = csum_move(csum_move32(tcsum, old_saddr, saddr), old_sport, sport);
	__builtin_memcpy(hdr + PPS_SADDR_OFF, &saddr, 4);
	__builtin_memcpy(hdr + PPS_SPORT_OFF, &sport, 2);
	__builtin_memcpy(hdr + PPS_ICSUM_OFF, &icsum, 2);
	__builtin_memcpy(hdr + PPS_TCSUM_OFF, &tcsum, 2);
}

/* `sluice lab flood`'s shapes (internal/bench/flood_shape.go builds the
 * same frames in Go for the paced sender, and says what each shape is for).
 * With gen_shape set, xdp_pps_gen writes frame n of the shape, n counted in
 * flood_state. A shape's frames are of up to three kinds (a SYN, an ACK,
 * ...), each a whole frame in shape_tmpl[kind], set by the loader with its
 * checksums right as it stands. Frame n picks a kind and a source s:
 *
 *   syn     n: the SYN of source n
 *   udp     2s: source s's first datagram; 2s+1: the second datagram of
 *           source s - udp_lag, none (XDP_DROP) while s < udp_lag
 *   ack     2s: a SYN, 2s+1: an ACK, both of source s
 *   synack  2s: a SYN-ACK, 2s+1: an ACK, both of flow s
 *   dsr3    3s: a SYN, 3s+1: an ACK, 3s+2: an ACK with data, of source s
 *
 * and is its kind's template with s's fields written, both checksums
 * updated (RFC 1624), cut to shape_len[kind]:
 *
 *   all but synack  source address the template's + (s >> 15 & 0xffff),
 *                   port 1024 + (s & 0x7fff): the sources of gen_syn
 *   synack          destination port shape_ports_lo + s % shape_ports_n
 *   TCP but syn     sequence number the template's + flood_mix(s), and
 *                   with ACK set the acknowledgment number the
 *                   template's + flood_mix(~s)
 *
 * udp's second datagram is meant to come a second or more after the first:
 * udp_lag is how many sources start in that time, which the loader sets
 * between runs from the rate the generator has reached so far (it does not
 * know the rate before). */
#define FLOOD_ROOM  64 /* the frame the generator runs on */
#define FLOOD_KINDS 3

enum {
	FLOOD_SHAPE_NONE,
	FLOOD_SHAPE_SYN,
	FLOOD_SHAPE_UDP,
	FLOOD_SHAPE_ACK,
	FLOOD_SHAPE_SYNACK,
	FLOOD_SHAPE_DSR3,
};

volatile const __u8 gen_shape;
volatile const __u8 shape_tmpl[FLOOD_KINDS][FLOOD_ROOM] __attribute__((aligned(8)));
volatile const __u16 shape_len[FLOOD_KINDS];
volatile const __u16 shape_ports_lo;
volatile const __u32 shape_ports_n = 1;

/* The flood's frame sequence, shared by all CPUs: the flood runs one
 * generator at a time, so the counter needs no atomics. */
struct flood_state {
	__u64 seq;               /* the next frame's n */
	__u64 udp_lag;           /* udp: sources between a source's two datagrams */
	__u64 sent[FLOOD_KINDS]; /* frames sent, by kind */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flood_state);
} flood_state SEC(".maps");

/* flood_mix spreads a source's number over 32 bits, a bijection of
 * multiplies and xorshifts (as hash finalizers mix): sequence numbers
 * that look random, every source's its own, and 0 for source 0. */
static __always_inline __u32 flood_mix(__u32 x)
{
	x *= 0x9e3779b1;
	x ^= x >> 15;
	x *= 0x85ebca77;
	x ^= x >> 13;
	return x;
}

/* flood_set16 and flood_set32 write a field (network order) and fold its
 * change into the checksum csum. */
static __always_inline void flood_set16(__u8 *p, int off, __u16 v, __u16 *csum)
{
	__u16 old;

	__builtin_memcpy(&old, p + off, 2);
	*csum = csum_move(*csum, old, v);
	__builtin_memcpy(p + off, &v, 2);
}

static __always_inline void flood_set32(__u8 *p, int off, __u32 v, __u16 *csum)
{
	__u32 old;

	__builtin_memcpy(&old, p + off, 4);
	*csum = csum_move32(*csum, old, v);
	__builtin_memcpy(p + off, &v, 4);
}

/* flood_add32 adds delta to the 32-bit field at off (a TCP sequence or
 * acknowledgment number), csum updated. */
static __always_inline void flood_add32(__u8 *p, int off, __u32 delta, __u16 *csum)
{
	__u32 v;

	__builtin_memcpy(&v, p + off, 4);
	flood_set32(p, off, bpf_htonl(bpf_ntohl(v) + delta), csum);
}

/* flood_next writes frame n of gen_shape into ctx's frame: 0 to send it,
 * 1 when frame n is none (udp, the first udp_lag sources' seconds), -1 on
 * error. */
static __always_inline int flood_next(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	const volatile __u64 *src;
	__u64 *dst = data, n, half;
	struct flood_state *st;
	__u32 key = 0, s, kind = 0, saddr, old;
	__u16 icsum, l4csum;
	__u8 *p = data;
	int i, tcp, delta;

	st = bpf_map_lookup_elem(&flood_state, &key);
	if (!st || data + FLOOD_ROOM > data_end)
		return -1;
	n = st->seq++;
	switch (gen_shape) {
	case FLOOD_SHAPE_SYN:
		s = n;
		break;
	case FLOOD_SHAPE_UDP:
		half = n >> 1;
		if (n & 1) {
			if (half < st->udp_lag)
				return 1;
			half -= st->udp_lag;
			kind = 1;
		}
		s = half;
		break;
	case FLOOD_SHAPE_ACK:
	case FLOOD_SHAPE_SYNACK:
		s = n >> 1;
		kind = n & 1;
		break;
	case FLOOD_SHAPE_DSR3:
		s = n / 3;
		kind = n % 3;
		break;
	default:
		return -1;
	}
	/* Clang knows kind < 3 and would drop the check the verifier needs
	 * for the variable offsets below. */
	asm volatile("" : "+r"(kind));
	if (kind >= FLOOD_KINDS)
		return -1;
	src = (const volatile __u64 *)shape_tmpl[kind];
#pragma unroll
	for (i = 0; i < FLOOD_ROOM / 8; i++)
		dst[i] = src[i];

	tcp = p[23] == 6;
	__builtin_memcpy(&icsum, p + PPS_ICSUM_OFF, 2);
	if (tcp)
		__builtin_memcpy(&l4csum, p + PPS_TCSUM_OFF, 2);
	else
		__builtin_memcpy(&l4csum, p + PPS_UCSUM_OFF, 2);
	if (gen_shape == FLOOD_SHAPE_SYNACK) {
		flood_set16(p, PPS_SPORT_OFF + 2, bpf_htons(shape_ports_lo + s % shape_ports_n), &l4csum);
	} else {
		/* The address is in the L4 checksum's pseudo-header too. */
		__builtin_memcpy(&old, p + PPS_SADDR_OFF, 4);
		saddr = bpf_htonl(bpf_ntohl(old) + ((s >> 15) & 0xffff));
		icsum = csum_move32(icsum, old, saddr);
		flood_set32(p, PPS_SADDR_OFF, saddr, &l4csum);
		flood_set16(p, PPS_SPORT_OFF, bpf_htons(1024 + (s & 0x7fff)), &l4csum);
	}
	if (tcp && gen_shape != FLOOD_SHAPE_SYN) {
		flood_add32(p, 38, flood_mix(s), &l4csum);
		if (p[47] & 0x10) /* ACK */
			flood_add32(p, 42, flood_mix(~s), &l4csum);
	}
	__builtin_memcpy(p + PPS_ICSUM_OFF, &icsum, 2);
	if (tcp) {
		__builtin_memcpy(p + PPS_TCSUM_OFF, &l4csum, 2);
	} else {
		/* UDP sends a checksum of 0 as 0xffff: 0 is none. */
		if (!l4csum)
			l4csum = 0xffff;
		__builtin_memcpy(p + PPS_UCSUM_OFF, &l4csum, 2);
	}
	delta = (int)shape_len[kind] - (int)bpf_xdp_get_buff_len(ctx);
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta))
		return -1;
	st->sent[kind]++;
	return 0;
}

/* xdp_write_header rewrites the frame's headers; a frame from the live
 * frames page pool may hold what the device under test made of it. */
static __always_inline int xdp_write_header(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	if (gen_syn) {
		if (data + 56 > data_end)
			return -1;
		pps_next_syn(data);
		return 0;
	}
	if (data + PPS_HDR_LEN > data_end)
		return -1;
	pps_next_header(data);
	return 0;
}

SEC("xdp")
int xdp_pps_gen(struct xdp_md *ctx)
{
	if (gen_shape) {
		switch (flood_next(ctx)) {
		case 0:
			return XDP_TX;
		case 1:
			return XDP_DROP; /* nothing sent, the page recycled */
		default:
			return XDP_ABORTED;
		}
	}
	if (xdp_write_header(ctx))
		return XDP_ABORTED;
	return XDP_TX;
}

volatile const __u32 node_cpu;

#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#define READ_ONCE(x) (*(const volatile typeof(x) *)&(x))

/* The sink's count on node_cpu as the windowed generator reads it: copied
 * every PPS_PUB_EVERY frames into a cache line of its own. Were the
 * generator to read the sink's counter itself, for every frame, the line
 * the sink writes for every frame would move to the generator's CPU and
 * back: a cache miss per packet on the node CPU, a cost no generator on
 * another machine puts there (it was ~50 ns a packet, more than a third of
 * what xdp_lb_ingress costs). The copy lags by fewer than PPS_PUB_EVERY
 * frames, which only makes the window count more frames in flight than
 * there are. */
#define PPS_PUB_EVERY 32

struct pps_pub {
	__u64 before[8]; /* apart from whatever the map keeps before it */
	__u64 count;
	__u64 after[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pps_pub);
} pps_pub SEC(".maps");

/* Flow control for --node-cpu with threaded NAPI: the generator keeps at
 * most `window` frames between itself and the sink, fewer than a veth ring
 * (256) holds, so none is lost on the way. Frames go out in live frames
 * batches (see xdp_pps_gen_win); a frame that does not fit returns
 * XDP_DROP (nothing sent, the page recycled at once). Frames that never
 * arrive (dropped on the way) would close the window for good: when the
 * published count has not moved for stall_ns, the frames in flight count
 * as lost. */
volatile const __u32 window = 192;
volatile const __u64 stall_ns = 100 * 1000 * 1000;

struct pps_win {
	__u64 sent;     /* frames sent, from the sink's count at the start */
	__u64 lost;     /* frames given up on */
	__u64 seen;     /* the sink's count when last looked at */
	__u64 seen_at;  /* and when it last moved (ktime ns) */
	__u64 frames;   /* frames the generator ran on, sent or dropped */
};

/* The generator's state, written by the loader before each run and then
 * only by the generator's CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pps_win);
} pps_win SEC(".maps");

/* pps_in_flight is how many frames the window counts between the
 * generator and the sink, by the published count. */
static __always_inline __s64 pps_in_flight(const struct pps_win *w, const struct pps_pub *pub)
{
	return (__s64)(w->sent - w->lost - READ_ONCE(pub->count));
}

struct pps_wait {
	const struct pps_win *w;
	const struct pps_pub *pub;
	__u64 deadline; /* ktime ns */
};

/* The live frames runner hands frames to eth0 in batches of `batch`: the
 * node's NAPI thread is woken once a batch, at its end. At the start of a
 * batch the generator waits, reading the published count, until the whole
 * batch fits in the window, so that it need not drop frames halfway:
 * every frame dropped goes back to the live frames page pool, whose ring
 * the node CPU returns pages to, and a generator dropping frames as fast
 * as it can held that ring's lock against the node (a sixth of the node
 * CPU spent waiting for it). The wait ends after wait_ns, far longer than
 * the slowest contender takes for a batch (128 frames at 0.3 Mpps: 0.4
 * ms); only a stalled node makes the generator drop frames again. The
 * pool's ring holds a batch, fewer pages than the window: pages the node
 * returns to a full ring are freed instead (measured: ~0.2% of them). */
volatile const __u32 batch = 128;
volatile const __u64 wait_ns = 10 * 1000 * 1000;
#define PPS_WAIT_MAX (1 << 23) /* bpf_loop's limit */

static long pps_wait_step(__u64 i, void *arg)
{
	const struct pps_wait *c = arg;

	if (pps_in_flight(c->w, c->pub) <= window - batch)
		return 1; /* stop: the batch fits */
	return (i & 63) == 0 && bpf_ktime_get_ns() > c->deadline;
}

SEC("xdp")
int xdp_pps_gen_win(struct xdp_md *ctx)
{
	struct pps_wait wait;
	struct pps_win *w;
	struct pps_pub *pub;
	__u32 key = 0;
	__u64 sunk, now;

	w = bpf_map_lookup_elem(&pps_win, &key);
	pub = bpf_map_lookup_elem(&pps_pub, &key);
	if (!w || !pub)
		return XDP_ABORTED;
	/* Frames given up on that arrived after all: not lost. */
	sunk = READ_ONCE(pub->count);
	if ((__s64)(w->sent - w->lost - sunk) < 0)
		w->lost = w->sent - sunk;
	if (w->frames++ % batch == 0 && pps_in_flight(w, pub) > window - batch) {
		wait.w = w;
		wait.pub = pub;
		wait.deadline = bpf_ktime_get_ns() + wait_ns;
		bpf_loop(PPS_WAIT_MAX, pps_wait_step, &wait, 0);
	}
	sunk = READ_ONCE(pub->count);
	if ((__s64)(w->sent - w->lost - sunk) >= window) {
		now = bpf_ktime_get_ns();
		if (sunk != w->seen) {
			w->seen = sunk;
			w->seen_at = now;
		} else if (now - w->seen_at > stall_ns) {
			w->lost = w->sent - sunk;
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
	__u8 hdr[56] __attribute__((aligned(8)));

	if (gen_syn) {
		pps_next_syn(hdr);
		if (bpf_skb_store_bytes(skb, 0, hdr, PPS_SYN_LEN, 0))
			return TC_ACT_SHOT;
	} else {
		pps_next_header(hdr);
		if (bpf_skb_store_bytes(skb, 0, hdr, PPS_HDR_LEN, 0))
			return TC_ACT_SHOT;
	}
	bpf_tail_call(skb, &pps_tc_target, 0);
	return TC_ACT_SHOT;
}

/* pps_count_frame counts one frame on this CPU, and publishes the count
 * on node_cpu every PPS_PUB_EVERY frames. */
static __always_inline void pps_count_frame(void)
{
	__u32 key = 0;
	__u64 *n = bpf_map_lookup_elem(&pps_count, &key);
	struct pps_pub *pub;
	__u64 c;

	if (!n)
		return;
	c = *n + 1;
	*n = c;
	if (c % PPS_PUB_EVERY == 0 && bpf_get_smp_processor_id() == node_cpu) {
		pub = bpf_map_lookup_elem(&pps_pub, &key);
		if (pub)
			WRITE_ONCE(pub->count, c);
	}
}

/* xdp_pps_sink counts every frame: the ceiling, on eth0. */
SEC("xdp")
int xdp_pps_sink(struct xdp_md *ctx)
{
	pps_count_frame();
	return XDP_DROP;
}

/* Where the node forwards the benchmark's packets: the next hop's MAC,
 * the backend's (two NICs) or its node's (one NIC), and the backend's
 * address and port (network byte order) the packets must now carry. */
volatile const __u8 next_hop_mac[6] __attribute__((aligned(4)));
volatile const __u32 backend_addr;
volatile const __u16 backend_port;
/* The node's addresses a masqueraded packet may come from: the NodePort's
 * (sluice) and the egress device's (the kernel's MASQUERADE). */
volatile const __u32 node_addrs[2];
/* The benchmark's L4 protocol: UDP, or TCP with --new-flows. */
volatile const __u8 l4_proto = 17;

/* xdp_pps_sink_to counts only the frames the node forwarded and
 * translated: to next_hop_mac, IPv4 UDP from node_addrs (masqueraded) to
 * backend_addr:backend_port. On
 * one NIC the sink sits on the client's side of the wire, where an ICMP
 * error or a packet sent back untranslated must not count. */
SEC("xdp")
int xdp_pps_sink_to(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *pkt = __builtin_assume_aligned(data, 8);
	__u16 proto, dport;
	__u32 saddr, daddr;

	if (data + PPS_HDR_LEN > data_end)
		return XDP_DROP;
	if (*(__u32 *)pkt != *(const volatile __u32 *)next_hop_mac ||
	    *(__u16 *)(pkt + 4) != *(const volatile __u16 *)(next_hop_mac + 4))
		return XDP_DROP;
	__builtin_memcpy(&proto, pkt + 12, 2);
	__builtin_memcpy(&saddr, pkt + 26, 4);
	__builtin_memcpy(&daddr, pkt + 30, 4);
	__builtin_memcpy(&dport, pkt + 36, 2);
	/* 0x45: IPv4 without options, as the generator writes it. */
	if (proto != bpf_htons(0x0800) || pkt[14] != 0x45 || pkt[23] != l4_proto ||
	    (saddr != node_addrs[0] && saddr != node_addrs[1]) ||
	    daddr != backend_addr || dport != backend_port)
		return XDP_DROP;
	pps_count_frame();
	return XDP_DROP;
}

/* The DSR tunnel's outer destination (network byte order): the backend's
 * node, where an LB node in dsr mode sends new flows in IPIP. */
volatile const __u32 tunnel_addr;

/* xdp_pps_sink_tunnel counts only the frames the node sent to the next
 * hop in an IPIP header (an IPv4 option or none) from node_addrs to
 * tunnel_addr: a DSR LB node's. */
SEC("xdp")
int xdp_pps_sink_tunnel(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *pkt = __builtin_assume_aligned(data, 8);
	__u32 saddr, daddr;
	__u16 proto;

	if (data + 34 > data_end)
		return XDP_DROP;
	if (*(__u32 *)pkt != *(const volatile __u32 *)next_hop_mac ||
	    *(__u16 *)(pkt + 4) != *(const volatile __u16 *)(next_hop_mac + 4))
		return XDP_DROP;
	__builtin_memcpy(&proto, pkt + 12, 2);
	__builtin_memcpy(&saddr, pkt + 26, 4);
	__builtin_memcpy(&daddr, pkt + 30, 4);
	if (proto != bpf_htons(0x0800) || (pkt[14] >> 4) != 4 || pkt[23] != 4 /* IPIP */ ||
	    (saddr != node_addrs[0] && saddr != node_addrs[1]) || daddr != tunnel_addr)
		return XDP_DROP;
	pps_count_frame();
	return XDP_DROP;
}

/* tc_pps_sink_local counts, at tc ingress after XDP passed them to the
 * stack, the frames the node translated for a local backend (IPv4 to
 * backend_addr:backend_port), and drops every frame: the cost of a local
 * delivery up to the stack, without the pod's. */
static __always_inline bool pps_to_backend(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *pkt = data;
	__u32 daddr;
	__u16 dport;

	if (data + PPS_HDR_LEN > data_end)
		return false;
	__builtin_memcpy(&daddr, pkt + 30, 4);
	__builtin_memcpy(&dport, pkt + 36, 2);
	return skb->protocol == bpf_htons(0x0800) && pkt[14] == 0x45 && daddr == backend_addr && dport == backend_port;
}

SEC("tc")
int tc_pps_sink_local(struct __sk_buff *skb)
{
	if (pps_to_backend(skb))
		pps_count_frame();
	return TC_ACT_SHOT;
}

/* tc_pps_sink_pod counts and drops, at tc ingress of a lab pod's eth0,
 * the packets to backend_addr:backend_port, and passes every other frame:
 * the pod still answers its node's ARP and neighbour solicitations. */
SEC("tc")
int tc_pps_sink_pod(struct __sk_buff *skb)
{
	if (!pps_to_backend(skb))
		return TC_ACT_OK;
	pps_count_frame();
	return TC_ACT_SHOT;
}

/* The forwarder's rewrite: the MACs of the next hop and of the egress
 * device, the node's address as source (as masquerading gives it), the
 * backend's address and port as destination; fwd_ifindex 0 sends back out
 * the device (XDP_TX), else redirects there. */
volatile const __u8 fwd_dmac[6] __attribute__((aligned(4)));
volatile const __u8 fwd_smac[6] __attribute__((aligned(4)));
volatile const __u32 fwd_saddr;
volatile const __u32 fwd_daddr;
volatile const __u16 fwd_dport;
volatile const __u32 fwd_ifindex;

/* pps_fwd_rewrite is the forwarder's rewrite: the destination address
 * and port to the backend's and, with snat, the source address to the
 * node's and the MACs to the next hop's (both checksums updated). IPv4
 * without options, UDP or TCP; -1 for any other frame. */
static __always_inline int pps_fwd_rewrite(struct xdp_md *ctx, bool snat)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *pkt = data;
	__u32 saddr, daddr, nsaddr = fwd_saddr, ndaddr = fwd_daddr;
	__u16 icsum, l4csum, dport, ndport = fwd_dport;
	__u32 l4csum_off;

	if (data + 56 > data_end || pkt[14] != 0x45)
		return -1;
	if (pkt[23] == 17)
		l4csum_off = 40;
	else if (pkt[23] == 6)
		l4csum_off = 50;
	else
		return -1;
	__builtin_memcpy(&saddr, pkt + 26, 4);
	__builtin_memcpy(&daddr, pkt + 30, 4);
	__builtin_memcpy(&dport, pkt + 36, 2);
	__builtin_memcpy(&icsum, pkt + PPS_ICSUM_OFF, 2);
	__builtin_memcpy(&l4csum, pkt + l4csum_off, 2);
	if (!snat)
		nsaddr = saddr;
	icsum = csum_move32(csum_move32(icsum, saddr, nsaddr), daddr, ndaddr);
	if (l4csum || pkt[23] == 6) {
		l4csum = csum_move32(csum_move32(l4csum, saddr, nsaddr), daddr, ndaddr);
		l4csum = csum_move(l4csum, dport, ndport);
		if (!l4csum && pkt[23] == 17)
			l4csum = 0xffff;
	}
	if (snat) {
		/* Volatile loads: the loader sets these after compilation. */
		*(__u32 *)pkt = *(const volatile __u32 *)fwd_dmac;
		*(__u16 *)(pkt + 4) = *(const volatile __u16 *)(fwd_dmac + 4);
		*(__u32 *)(pkt + 6) = *(const volatile __u32 *)fwd_smac;
		*(__u16 *)(pkt + 10) = *(const volatile __u16 *)(fwd_smac + 4);
		__builtin_memcpy(pkt + 26, &nsaddr, 4);
	}
	__builtin_memcpy(pkt + 30, &ndaddr, 4);
	__builtin_memcpy(pkt + 36, &ndport, 2);
	__builtin_memcpy(pkt + PPS_ICSUM_OFF, &icsum, 2);
	__builtin_memcpy(pkt + l4csum_off, &l4csum, 2);
	return 0;
}

/* xdp_pps_fwd is the forwarding ceiling: what a translating XDP forwarder
 * costs at the least on this path: the same rewrite as the node's DNAT and
 * SNAT, without any map lookup, state or route; fwd_ifindex 0 sends back
 * out the device (XDP_TX), else redirects there. */
SEC("xdp")
int xdp_pps_fwd(struct xdp_md *ctx)
{
	if (pps_fwd_rewrite(ctx, true))
		return XDP_PASS;
	if (fwd_ifindex)
		return bpf_redirect(fwd_ifindex, 0);
	return XDP_TX;
}

/* xdp_pps_fwd_local is the ceiling of a local delivery: the DNAT alone
 * (the frame stays addressed to this node's MAC) and XDP_PASS, so that
 * what follows is the kernel's: an skb, GRO, tc ingress, where
 * tc_pps_sink_local counts it. What an XDP load balancer that hands a
 * local backend's packets to the stack costs at the least. */
SEC("xdp")
int xdp_pps_fwd_local(struct xdp_md *ctx)
{
	pps_fwd_rewrite(ctx, false);
	return XDP_PASS;
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
