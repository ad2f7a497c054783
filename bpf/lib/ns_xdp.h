/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* XDP's part of the service path (nodeport.h): the way the FIB gives a
 * packet, asked before anything of it is translated or counted. Where XDP
 * cannot send by it (an overlay, a VLAN device, a bridge: ns_xdp_defers),
 * the frame goes on to tc untouched, which does it all. */
#ifndef __SLUICE_NS_XDP_H
#define __SLUICE_NS_XDP_H

#include "ns_send.h"

#ifdef SLUICE_XDP
/* ns_xdp_route asks the FIB the way of p (its own source, which the route
 * does not depend on) to backend be:be_port before p is translated, into
 * the scratch's fib buffer, kept in keep (or NULL) as ns_fib keeps it. It
 * returns the FIB's answer for ns_send (also in the scratch's fib_rc), or -1 when XDP leaves p to tc
 * untouched (ns_xdp_defers). A global function, verified once: its FIB
 * call stays out of the service path's states. */
__noinline int ns_xdp_route(struct xdp_md *ctx, const struct ns_pkt *p, const union lb_addr *be,
			    __be16 be_port, struct ct_entry *keep)
{
	struct ct_scratch *s = ns_scratch();
	const struct ns_config *cfg = ns_cfg();
	struct bpf_fib_lookup *fib;
	long rc;

	if (!ctx || !p || !be || !s || !cfg)
		return -1;
	fib = &s->fib;
	/* The CT second only where the answer is kept (five arguments at
	 * most). */
	rc = ns_fib(ctx, p, &p->daddr, p->sport, be, be_port, keep, keep ? ct_now(cfg) : 0, fib);
	s->fib_rc = rc;
	return ns_xdp_defers(ctx, rc, fib) ? -1 : (int)rc;
}

/* ns_xdp_established_defers: XDP leaves the packet p of the established
 * flow e to tc when e is masqueraded and its way is one XDP cannot send
 * by (ns_xdp_route): asked before the flow's state or counters are
 * touched, so that tc, which does it all, counts the packet once. The
 * FIB's answer is kept in e, where the translation finds it (ns_fib). */
static __always_inline bool ns_xdp_established_defers(struct __ctx_buff *ctx,
						      const struct ns_pkt *p,
						      struct ct_entry *e)
{
	if (e->flags & (CT_F_LOCAL | CT_F_DSR))
		return false;
	return ns_xdp_route(ctx, p, (const union lb_addr *)e->nat_addr, e->nat_port, e) < 0;
}
#endif /* SLUICE_XDP */

#endif /* __SLUICE_NS_XDP_H */
