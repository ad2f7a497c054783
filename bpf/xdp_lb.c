// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* North-south Service load balancing at XDP on the node's external devices,
 * the same code as tc_lb.c (lib/nodeport.h) on the XDP ctx. Replies of local
 * backends leave through the stack and are handled by tc_lb_egress.
 */
#define SLUICE_XDP
#include "nodeport.h"

SEC("xdp")
int xdp_lb_ingress(struct xdp_md *ctx)
{
	return nodeport_ingress(ctx);
}

/* xdp_ct_clock returns the CT clock (seconds) when run with BPF_PROG_RUN:
 * the agent reads "now" for ct list and garbage collection from it, so both
 * sides use the very same clock. Never attached. */
SEC("xdp")
int xdp_ct_clock(struct xdp_md *ctx)
{
	const struct ns_config *cfg = ns_cfg();

	return cfg ? ct_now(cfg) : 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
