/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The north-south programs' events and drop accounting (events.h).
 *
 * A drop site returns NS_DROP(reason) instead of CTX_ACT_DROP; the verdict
 * travels up through the callers, which pass any value they do not know
 * on, and the program's entry (ns_verdict) counts it, writes its event
 * and drops. One place that writes drop events per program keeps the
 * verifier's work and the stack where they were. A plain CTX_ACT_DROP
 * (a rewrite or helper that failed) is counted as SL_DROP_UNKNOWN. */
#ifndef __SLUICE_NS_EVENTS_H
#define __SLUICE_NS_EVENTS_H

#include "common.h"
#include "ctx.h"
#include "l4.h"
#include "maps.h"
#include "events.h"

/* Above every CTX_ACT_* of tc and XDP. */
#define NS_DROP_BASE 0x100
#define NS_DROP(reason) (NS_DROP_BASE + (reason))

#if defined(SLUICE_XDP)
#define SL_HOOK_THIS SL_HOOK_XDP
#elif defined(SLUICE_POD_LB)
#define SL_HOOK_THIS SL_HOOK_POD
#else
#define SL_HOOK_THIS SL_HOOK_TC_INGRESS
#endif

/* tc egress: a local backend's reply (tc_lb.c), or the traffic to a pod
 * (tc_pod.c). */
#ifdef SLUICE_POD_LB
#define SL_HOOK_EGRESS SL_HOOK_POD
#else
#define SL_HOOK_EGRESS SL_HOOK_TC_EGRESS
#endif

/* sl_what packs an event's type, drop reason, mode and hook for
 * sl_ns_event, which takes five arguments at most. */
#define sl_what(type, reason, mode, hook) \
	((type) | ((reason) << 8) | ((mode) << 16) | ((__u32)(hook) << 24))

/* sl_rev_len packs a frontend's rev_nat_id and the packet's length
 * (bytes, at most 65535: a GRO packet's is cut). */
static __always_inline __u32 sl_rev_len(__u16 rev_nat_id, __u32 len)
{
	return ((__u32)rev_nat_id << 16) | (len > 0xffff ? 0xffff : len);
}

/* sl_ns_event writes an event about packet p to the ring (when this CPU
 * is within its rate): what (sl_what), the frontend and length
 * (sl_rev_len), the backend chosen (its address read from lb_backends)
 * and the device. Off the hot path: drops, new flows while traced. A
 * global function, verified once however many sites call it (the
 * verifier gives it p as memory that may be NULL). */
__noinline int sl_ns_event(const struct ns_pkt *p, __u32 what, __u32 rev_len, __u32 backend_id,
			   __u32 ifindex)
{
	struct sl_event *ev;
	const struct lb_backend *be;

	if (!p)
		return 0;
	ev = sl_ev_reserve();
	if (!ev)
		return 0;
	ev->type = what & 0xff;
	ev->reason = (what >> 8) & 0xff;
	ev->mode = (what >> 16) & 0xff;
	ev->hook = what >> 24;
	ev->proto = p->proto;
	ev->tcp_flags = p->tcp_flags;
	ev->rev_nat_id = rev_len >> 16;
	ev->len = rev_len & 0xffff;
	ev->ifindex = ifindex;
	ev->backend_id = backend_id;
	__builtin_memcpy(ev->saddr, p->saddr.b, sizeof(ev->saddr));
	__builtin_memcpy(ev->daddr, p->daddr.b, sizeof(ev->daddr));
	ev->sport = p->sport;
	ev->dport = p->dport;
	if (backend_id) {
		be = bpf_map_lookup_elem(&lb_backends, &backend_id);
		if (be) {
			__builtin_memcpy(ev->baddr, be->addr, sizeof(ev->baddr));
			ev->bport = be->port;
		}
	}
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

/* sl_note_drop counts a drop of len bytes for reason and writes its event
 * when drop events are on. */
static __always_inline void sl_note_drop(const struct ns_pkt *p, __u32 reason, __u32 len,
					 __u32 ifindex, __u8 hook)
{
	sl_count_drop(reason, len);
	if (sl_ev_wanted(SL_EVF_DROP))
		sl_ns_event(p, sl_what(SL_EV_DROP, reason, SL_MODE_NONE, hook),
			    sl_rev_len(0, len), 0, ifindex);
}

/* ns_verdict turns the service path's answer for p into the program's:
 * a drop (NS_DROP or CTX_ACT_DROP) is counted and reported, anything
 * else returned as it is. */
static __always_inline int ns_verdict(struct __ctx_buff *ctx, const struct ns_pkt *p, int ret,
				      __u8 hook)
{
	if (ret != CTX_ACT_DROP && ret < NS_DROP_BASE)
		return ret;
	sl_note_drop(p, ret >= NS_DROP_BASE ? ret - NS_DROP_BASE : SL_DROP_UNKNOWN,
		     ctx_len(ctx), ctx_ifindex(ctx), hook);
	return CTX_ACT_DROP;
}

/* sl_ns_mode is the event mode of a flow of CT kind (CT_F_LOCAL,
 * CT_F_DSR) on a DSR backend node (tunnel) or not. */
#define sl_ns_mode(kind, tunnel)                                      \
	((tunnel) ? SL_MODE_DSR_BACKEND :                             \
	 ((kind) & CT_F_LOCAL) ? SL_MODE_LOCAL :                      \
	 ((kind) & CT_F_DSR) ? SL_MODE_DSR : SL_MODE_SNAT)

#endif /* __SLUICE_NS_EVENTS_H */
