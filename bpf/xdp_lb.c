// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* North-south Service load balancing at XDP on the node's external devices,
 * the same code as tc_lb.c (lib/nodeport.h) on the XDP ctx. Replies of local
 * backends leave through the stack and are handled by tc_lb_egress.
 */
#define SLUICE_XDP
#include "ns_entry.h"
#include "xdp_entry.h"

SEC("xdp")
int xdp_lb_ingress(struct xdp_md *ctx)
{
	return nodeport_ingress(ctx);
}

XDP_LB_ENTRY_MAP xdp_lb_entry SEC(".maps") = {
	.values = {
		[0] = (void *)&xdp_lb_ingress,
	},
};

char __license[] SEC("license") = "Dual BSD/GPL";
