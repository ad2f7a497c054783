// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The front of XDP on a device whose NIC takes 802.1Q tags off before XDP
 * runs (rx-vlan-offload, on by default on most server NICs and on a veth)
 * and that has VLAN devices on it. XDP sees such a frame untagged, as one
 * of the native VLAN: translated and sent back out untagged, it would leak
 * across VLANs. From 6.8 a device-bound program reads the tag the driver
 * took off (bpf_xdp_metadata_rx_vlan_tag); this one is loaded for one
 * device (BPF_F_XDP_DEV_BOUND_ONLY), passes every tagged frame to the stack,
 * where tc leaves it to its VLAN device (ns_vlan_tagged), and hands the
 * rest to the service path by tail call (xdp_entry.h). A driver that cannot
 * say (any error but "no tag") gets the stack too: nothing is translated
 * that might be another VLAN's. The agent attaches it only where the
 * device reports the tag to XDP (netdev's xdp-rx-metadata-features), in
 * place of turning the offload off (internal/datapath/vlan.go).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "xdp_entry.h"

#define XDP_VLAN_ENODATA 61 /* ENODATA: the frame had no tag */

extern int bpf_xdp_metadata_rx_vlan_tag(const struct xdp_md *ctx, __be16 *vlan_proto,
					__u16 *vlan_tci) __ksym;

XDP_LB_ENTRY_MAP xdp_lb_entry SEC(".maps");

SEC("xdp")
int xdp_vlan_front(struct xdp_md *ctx)
{
	__be16 proto;
	__u16 tci;

	if (bpf_xdp_metadata_rx_vlan_tag(ctx, &proto, &tci) == -XDP_VLAN_ENODATA)
		bpf_tail_call(ctx, &xdp_lb_entry, 0);
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
