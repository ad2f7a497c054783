/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The XDP service path's entry (xdp_lb_ingress) as a tail-call target, for
 * the device-bound front of a device whose NIC takes VLAN tags off
 * (xdp_vlan.c). xdp_lb.c fills it as it loads; pinned, so that a front
 * attached by an earlier agent keeps reaching the service path while the
 * next one starts.
 */
#ifndef __SLUICE_XDP_ENTRY_H
#define __SLUICE_XDP_ENTRY_H

#define XDP_LB_ENTRY_MAP                                     \
	struct {                                             \
		__uint(type, BPF_MAP_TYPE_PROG_ARRAY);       \
		__uint(max_entries, 1);                      \
		__uint(key_size, sizeof(__u32));             \
		__uint(pinning, LIBBPF_PIN_BY_NAME);         \
		__array(values, int(struct xdp_md *));       \
	}

#endif /* __SLUICE_XDP_ENTRY_H */
