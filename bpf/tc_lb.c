// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* North-south Service load balancing at tc on the node's external devices:
 * NodePort, ExternalIP and LoadBalancer frontends, with conntrack, DNAT to
 * local backends and SNAT to remote ones. The logic is in lib/nodeport.h,
 * shared with xdp_lb.c.
 */
#define SLUICE_TC
#include "ns_entry.h"

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

/* tc_ct_clock returns the CT clock (seconds) when run with BPF_PROG_RUN:
 * the agent reads "now" for ct list and garbage collection from it, so both
 * sides use the very same clock (ct_now, the same in the XDP object). In
 * the tc object, which every node that balances per packet loads: the XDP
 * object is loaded only where a device may run it. Never attached. */
SEC("tc")
int tc_ct_clock(struct __sk_buff *ctx)
{
	const struct ns_config *cfg = ns_cfg();

	return cfg ? ct_now(cfg) : 0;
}

char __license[] SEC("license") = "Dual BSD/GPL";
