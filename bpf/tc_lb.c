// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* North-south Service load balancing at tc on the node's external devices:
 * NodePort, ExternalIP and LoadBalancer frontends, with conntrack, DNAT to
 * local backends and SNAT to remote ones. The logic is in lib/nodeport.h,
 * shared with xdp_lb.c.
 */
#define SLUICE_TC
#include "nodeport.h"

SEC("tc")
int tc_lb_ingress(struct __sk_buff *ctx)
{
	return nodeport_ingress(ctx);
}

SEC("tc")
int tc_lb_egress(struct __sk_buff *ctx)
{
	return nodeport_egress(ctx);
}

char __license[] SEC("license") = "Dual BSD/GPL";
