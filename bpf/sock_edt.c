// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The bandwidth manager's socket hook: cgroup sock_ops under --cgroup-root,
 * for the TCP sockets of the Pods in bw_addr (found by local address):
 *
 *   BBR (bw_enable_bbr)        congestion control bbr, set on connect() and
 *                              on a passive socket's establishment
 *   pacing (bw_enable_pacing)  a limited Pod's sockets that send are each
 *                              capped (SO_MAX_PACING_RATE: TCP paces itself,
 *                              fq or not, since 4.13) at the Pod's rate over
 *                              the number of its sockets that sent at least
 *                              half their share in one of the last two
 *                              windows of ~134 ms: a socket that sends little
 *                              (requests next to a bulk transfer) takes no
 *                              share from the ones that fill theirs, which
 *                              share the rate less what the thin ones sent
 *                              (else the policer would drop the requests)
 *
 * ECN for a limited Pod's connections is the agent's tcp_ecn=1 in the Pod's
 * namespace (internal/bandwidth/podnetns.go), not BPF_SOCK_OPS_NEEDS_ECN:
 * that sends the SYN ECT, which a peer with the default tcp_ecn=2 answers
 * without ECN.
 */
#include "edt.h"

volatile const __u32 bw_enable_bbr = 0;
volatile const __u32 bw_enable_pacing = 0;
/* Sockets are paced at this percentage of their share: 100 where pacing
 * holds the rate (the policer behind it only drops); above 100 under EDT,
 * where the stamps on the device hold it, so that a socket's timer firing
 * late (a busy CPU) costs the Pod none of its rate: the queue it builds in
 * fq is held by ECN (CE from EDTLimitFor's threshold) and BBR's model. */
volatile const __u32 bw_pace_pct = 100;

/* <sys/socket.h> and <netinet/tcp.h> are not for the BPF target. */
#define AF_INET            2
#define AF_INET6           10
#define SOL_SOCKET         1
#define SO_MAX_PACING_RATE 47
#define SOL_TCP            6
#define TCP_CONGESTION     13

/* Per-header bytes a TCP segment adds on the wire to its payload:
 * Ethernet 14, IPv4 20 or IPv6 40, TCP 20 + 12 of timestamps. Pacing
 * counts payload, the limit wire bytes. */
#define BW_TCP4_OVERHEAD 66
#define BW_TCP6_OVERHEAD 86

/* The pinned map's value keeps its size and places across upgrades: an
 * entry of an older agent (a 64-bit epoch, a 32-bit v6) reads as one with
 * no thin bytes, not counted. thin's 29 bits (512 MiB a window) clamp what
 * a thin socket of a Pod above about 30 Gbit/s sends: its Pod's other
 * sockets then count a little less of it. */
struct bw_sock {
	__u32 id;        /* the Pod's aggregate */
	__u32 rate;      /* SO_MAX_PACING_RATE set, payload bytes per second */
	__u32 epoch;     /* the window it was last looked at in (its low 32
			  * bits: 18 years of windows) */
	__u32 thin_prev; /* wire bytes it added to its Pod's thin count as a
			  * thin socket in window epoch - 1 */
	__u32 v6 : 1;      /* its packets are IPv6 */
	__u32 counted : 1;      /* counted sending in window epoch */
	__u32 counted_prev : 1; /* ... in window epoch - 1 */
	__u32 thin : 29;        /* ... in window epoch (0: counted sending) */
	__u32 segs;      /* data_segs_out then */
	__u64 acked;     /* bytes_acked then */
};

#define BW_SOCK_THIN_MAX 0x1fffffffULL /* bw_sock.thin's 29 bits */

/* TCP socket -> its Pod's aggregate and pacing. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct bw_sock);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bw_sock SEC(".maps");

/* A context field read kept in its own branch: clang would otherwise
 * merge the loads of local_ip4 and local_ip6[3] into one load at a computed
 * offset, which the verifier refuses for a context pointer. */
#define ctx_u32(x) ({ __u32 __v = (x); asm volatile("" : "+r"(__v)); __v; })

/* bw_sock_pod looks the socket's local address up in bw_addr; v6 says
 * whether its packets are IPv6 (not v4-mapped). */
static __always_inline struct bw_addr_val *bw_sock_pod(struct bpf_sock_ops *skops, __u32 *v6)
{
	__u32 key[4];

	if (skops->family == AF_INET) {
		key[0] = 0;
		key[1] = 0;
		key[2] = bpf_htonl(0xffff);
		key[3] = ctx_u32(skops->local_ip4);
		*v6 = 0;
	} else if (skops->family == AF_INET6) {
		key[0] = ctx_u32(skops->local_ip6[0]);
		key[1] = ctx_u32(skops->local_ip6[1]);
		key[2] = ctx_u32(skops->local_ip6[2]);
		key[3] = ctx_u32(skops->local_ip6[3]);
		*v6 = !(key[0] == 0 && key[1] == 0 && key[2] == bpf_htonl(0xffff));
	} else {
		return NULL;
	}
	return bpf_map_lookup_elem(&bw_addr, key);
}

/* bw_unpace lifts the socket's cap (~0U is unlimited to the kernel): its
 * Pod is no longer limited, or its share is beyond the option's 32 bits. */
static __always_inline void bw_unpace(struct bpf_sock_ops *skops, struct bw_sock *s)
{
	__u32 v = ~0U;

	if (s->rate && bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v)) == 0)
		s->rate = 0;
}

/* bw_roll starts the Pod's window epoch when st holds an older one. Only
 * the CPU that moves act_epoch resets the counts: two sockets rolling at
 * once would otherwise reset what the first added since (its own thin
 * bytes moved to the last window's count, where it would not find them
 * as its own). A count added between the move and the reset is lost for
 * one window, which the policer covers. */
static __always_inline void bw_roll(struct bw_state *st, __u64 epoch)
{
	__u64 e = READ_ONCE(st->act_epoch);

	/* Never back: another CPU may have read the clock in the last
	 * window and come here after this one rolled it. */
	if ((__s64)(epoch - e) <= 0 || __sync_val_compare_and_swap(&st->act_epoch, e, epoch) != e)
		return;
	WRITE_ONCE(st->act_prev, e + 1 == epoch ? READ_ONCE(st->act_cur) : 0);
	WRITE_ONCE(st->thin_prev, e + 1 == epoch ? READ_ONCE(st->thin_cur) : 0);
	WRITE_ONCE(st->act_cur, 0);
	WRITE_ONCE(st->thin_cur, 0);
}

/* bw_counts reads the Pod's sending sockets and the wire bytes per window
 * its thin ones sent, over window epoch and the one before, as of now
 * (bw_of_windows): a socket that does not count itself, one just
 * accepted, reads them without rolling the window. The socket's own thin
 * bytes are left out. */
static __always_inline __u64 bw_counts(const struct bw_state *st, const struct bw_sock *s, __u64 epoch,
				       __u64 *thin)
{
	__u64 e = READ_ONCE(st->act_epoch), tcur = READ_ONCE(st->thin_cur), tprev = READ_ONCE(st->thin_prev);
	__u64 own_cur = 0, own_prev = 0;

	/* Its own bytes in the Pod's windows e and e - 1. */
	if (s->epoch == (__u32)e) {
		own_cur = s->thin;
		own_prev = s->thin_prev;
	} else if (s->epoch + 1 == (__u32)e) {
		own_prev = s->thin;
	}
	tcur -= tcur < own_cur ? tcur : own_cur;
	tprev -= tprev < own_prev ? tprev : own_prev;
	*thin = bw_of_windows(e, epoch, tcur, tprev);
	return bw_sending(st, e, epoch);
}

/* bw_sock_seen records that the socket was looked at in window win and
 * what it had sent by then. */
static __always_inline void bw_sock_seen(struct bw_sock *s, struct bpf_sock_ops *skops, __u32 win)
{
	s->epoch = win;
	s->acked = skops->bytes_acked;
	s->segs = skops->data_segs_out;
}

/* bw_pace caps the socket at its share of the Pod's rate; count says it
 * is sending now. */
static __always_inline void bw_pace(struct bpf_sock_ops *skops, struct bw_sock *s, bool count)
{
	struct bw_limit *lim;
	struct bw_state *st = bw_lookup(s->id, BW_DIR_EGRESS, &lim);
	__u64 epoch, n, mss, rate, acked, sent, half, thin, w, ovh;
	__u32 v, segs, win;

	epoch = bpf_ktime_get_ns() >> BW_WINDOW_SHIFT;
	win = epoch;
	if (!st) {
		/* Unlimited now: looked at in this window (its Pod is looked
		 * up again in the next), counted nowhere. */
		bw_unpace(skops, s);
		bw_sock_seen(s, skops, win);
		s->counted = 0;
		s->counted_prev = 0;
		s->thin = 0;
		s->thin_prev = 0;
		return;
	}
	ovh = s->v6 ? BW_TCP6_OVERHEAD : BW_TCP4_OVERHEAD;
	if (count && s->epoch != win) {
		/* What it sent per window since it was last looked at; one
		 * that has no rate yet (just opened) counts at once. */
		acked = skops->bytes_acked;
		segs = skops->data_segs_out;
		w = s->epoch && win - s->epoch < 0x80000000U ? win - s->epoch : 1;
		sent = (acked - s->acked) / w;
		half = ((__u64)s->rate << BW_WINDOW_SHIFT) / NSEC_PER_SEC / 2;
		thin = sent + (__u64)(segs - s->segs) * ovh / w;
		s->thin_prev = s->epoch + 1 == win ? s->thin : 0;
		s->counted_prev = s->epoch + 1 == win ? s->counted : 0;
		bw_sock_seen(s, skops, win);
		bw_roll(st, epoch);
		if (!s->rate || sent >= half) {
			__sync_fetch_and_add(&st->act_cur, 1);
			s->counted = 1;
			s->thin = 0;
		} else {
			__sync_fetch_and_add(&st->thin_cur, thin);
			s->counted = 0;
			s->thin = thin < BW_SOCK_THIN_MAX ? thin : BW_SOCK_THIN_MAX;
		}
	}
	n = bw_counts(st, s, epoch, &thin);
	if (!n)
		n = 1;
	/* The rate the other thin sockets leave, wire bytes per second: at
	 * least a quarter of the Pod's. Not this one's own: a socket that
	 * sent less than half its share in a window (alone, on a busy CPU)
	 * must not lower its own cap by what it sent. */
	thin = (thin * NSEC_PER_SEC) >> BW_WINDOW_SHIFT;
	rate = lim->bps - (thin < lim->bps / 4 * 3 ? thin : lim->bps / 4 * 3);
	mss = skops->mss_cache;
	if (!mss)
		mss = 1448;
	rate = rate * mss / (mss + ovh) / n * bw_pace_pct / 100;
	if (rate >= 0xffffffffULL) {
		bw_unpace(skops, s);
		return;
	}
	if (!rate)
		rate = 1;
	if (rate == s->rate)
		return;
	v = rate;
	if (bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &v, sizeof(v)) == 0)
		s->rate = v;
}

/* bw_dec takes one from a count, never below zero: a count the window's
 * roll reset meanwhile is left alone (one try: a race costs one window's
 * count at most). */
static __always_inline void bw_dec(__u32 *c)
{
	__u32 v = READ_ONCE(*c);

	if (v)
		__sync_val_compare_and_swap(c, v, v - 1);
}

/* bw_uncount takes back the socket's count as a sending one once its data
 * is all acknowledged (its FIN acknowledged, or the connection gone):
 * short connections (requests on connections of their own next to a bulk
 * transfer) would otherwise take a share each for up to two windows after
 * they closed, and the bulk socket would be paced at a fraction of the
 * Pod's rate. Its counts of its window and the one before are in the
 * Pod's counts of those windows, whichever the Pod's are now. */
static __always_inline void bw_uncount(struct bw_sock *s)
{
	struct bw_limit *lim;
	struct bw_state *st;
	__u32 e;

	if (!s->counted && !s->counted_prev)
		return;
	st = bw_lookup(s->id, BW_DIR_EGRESS, &lim);
	if (st) {
		e = READ_ONCE(st->act_epoch);
		if (e == s->epoch) {
			if (s->counted)
				bw_dec(&st->act_cur);
			if (s->counted_prev)
				bw_dec(&st->act_prev);
		} else if (e == s->epoch + 1 && s->counted) {
			bw_dec(&st->act_prev);
		}
	}
	s->counted = 0;
	s->counted_prev = 0;
}

static __always_inline void bw_set_bbr(struct bpf_sock_ops *skops)
{
	char cc[] = "bbr";

	bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, cc, sizeof(cc));
}

/* bw_established starts tracking a limited Pod's socket. One it opened is
 * counted as sending at once, so connections opened together start at
 * their shares, not each at the Pod's whole rate; one it accepted counts
 * once it sends. */
static __always_inline void bw_established(struct bpf_sock_ops *skops, __u32 id, __u32 v6, bool active)
{
	struct bpf_sock *sk = skops->sk;
	struct bw_sock *s;

	if (!bw_enable_pacing || !id || !sk)
		return;
	s = bpf_sk_storage_get(&bw_sock, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s)
		return;
	s->id = id;
	s->v6 = v6;
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG |
					 BPF_SOCK_OPS_STATE_CB_FLAG);
	bw_pace(skops, s, active);
}

SEC("sockops")
int sock_edt(struct bpf_sock_ops *skops)
{
	struct bw_addr_val *pod;
	struct bpf_sock *sk;
	struct bw_sock *s;
	__u32 op = skops->op, v6, id;

	switch (op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		if (bw_enable_bbr && bw_sock_pod(skops, &v6))
			bw_set_bbr(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		pod = bw_sock_pod(skops, &v6);
		if (!pod)
			break;
		if (bw_enable_bbr && op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
			bw_set_bbr(skops);
		bw_established(skops, pod->id, v6, op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		if (!bw_enable_pacing)
			break;
		sk = skops->sk;
		s = sk ? bpf_sk_storage_get(&bw_sock, sk, 0, 0) : NULL;
		if (!s)
			break;
		/* Once a window, the Pod its address belongs to now: a limit
		 * removed leaves it unlimited (aggregate 0), and an aggregate
		 * ID given to another Pod since is not this one's. */
		if (s->epoch != (__u32)(bpf_ktime_get_ns() >> BW_WINDOW_SHIFT)) {
			pod = bw_sock_pod(skops, &v6);
			id = pod ? pod->id : 0;
			if (id != s->id) {
				s->id = id;
				s->thin = 0;
				s->thin_prev = 0;
			}
		}
		bw_pace(skops, s, true);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		/* FIN_WAIT2: its FIN acknowledged; CLOSE: every other way
		 * out (after LAST_ACK, TIME_WAIT through tcp_done, a reset). */
		if (skops->args[1] != BPF_TCP_FIN_WAIT2 && skops->args[1] != BPF_TCP_CLOSE)
			break;
		sk = skops->sk;
		s = sk ? bpf_sk_storage_get(&bw_sock, sk, 0, 0) : NULL;
		if (s)
			bw_uncount(s);
		break;
	}
	return 1;
}

char __license[] SEC("license") = "Dual BSD/GPL";
