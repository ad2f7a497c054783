// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Per-packet east-west Service load balancing (--socket-lb=false) at tc on
 * the host side of each local pod's veth:
 *
 *   tcx ingress (from the pod)  any frontend, scope INT: CT, DNAT, deliver
 *                               (redirect_peer to a local pod, else stack)
 *   tcx egress (to the pod)     a backend's reply: reverse DNAT via CT
 *
 * The service path is lib/nodeport.h's, with SLUICE_POD_LB: no SNAT, so a
 * backend sees the pod's own address and the VIP is on the wire.
 */
#define SLUICE_TC
#define SLUICE_POD_LB
#include "ns_entry.h"

SEC("tc")
int tc_pod_from_pod(struct __sk_buff *ctx)
{
	return nodeport_ingress(ctx);
}

SEC("tc")
int tc_pod_to_pod(struct __sk_buff *ctx)
{
	return nodeport_egress(ctx);
}

char __license[] SEC("license") = "Dual BSD/GPL";
