// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The bandwidth manager's tc programs (lib/edt.h), each first in its hook
 * and handing on to the next program (the load balancer's) unless it drops:
 *
 *   tc_edt_device   egress of --devices (EDT): stamp packets forwarded from
 *                   a limited Pod's veth; fq there holds them till then
 *   tc_edt_from_pod ingress of a Pod's host-side veth (no fq): police the
 *                   Pod's egress
 *   tc_edt_to_pod   egress of a Pod's host-side veth: the Pod's ingress,
 *                   stamped for fq on the veth under EDT, counted under
 *                   TBF there without fq (ingress.go: a policer takes TCP
 *                   far below the rate); under EDT, police traffic from a
 *                   limited Pod on this node, which never reaches a device
 */
#include "edt.h"

/* BW_MODE_EDT or BW_MODE_POLICE, set at load. */
volatile const __u32 bw_mode = BW_MODE_POLICE;
/* The benchmark's policer contenders only: police the Pod's ingress here,
 * with no qdisc on the veth (what the agent chose against, ingress.go). */
volatile const __u32 bw_ingress_police = 0;

SEC("tc")
int tc_edt_device(struct __sk_buff *ctx)
{
	__u32 id = bw_aggregate(ctx->ingress_ifindex);

	if (!id)
		return BW_NEXT;
	return bw_stamp(ctx, id, BW_DIR_EGRESS, bw_wire_len(ctx, true));
}

SEC("tc")
int tc_edt_from_pod(struct __sk_buff *ctx)
{
	__u32 id;

	if (bw_mode != BW_MODE_POLICE)
		return BW_NEXT;
	id = bw_aggregate(ctx->ifindex);
	if (!id)
		return BW_NEXT;
	return bw_police(ctx, id, BW_DIR_EGRESS, bw_wire_len(ctx, false));
}

SEC("tc")
int tc_edt_to_pod(struct __sk_buff *ctx)
{
	__u64 len = bw_wire_len(ctx, true);
	__u32 id;

	if (bw_mode == BW_MODE_EDT) {
		id = bw_aggregate(ctx->ingress_ifindex);
		if (id && bw_police(ctx, id, BW_DIR_EGRESS, len) == BW_DROP)
			return BW_DROP;
	}
	id = bw_aggregate(ctx->ifindex);
	if (!id)
		return BW_NEXT;
	if (bw_ingress_police)
		return bw_police(ctx, id, BW_DIR_INGRESS, len);
	if (bw_mode == BW_MODE_EDT)
		return bw_stamp(ctx, id, BW_DIR_INGRESS, len);
	return bw_count(id, BW_DIR_INGRESS, len);
}

char __license[] SEC("license") = "Dual BSD/GPL";
