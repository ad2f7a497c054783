/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Test harness for bpf/lib/maglev.h, compiled by bpf_test.go: the packet
 * carries a flow; the program stores its hash and the backend the
 * frontend's table selects, so the test compares both with the Go side. */
#include "maglev.h"

struct maglev_flow {
	union lb_addr saddr;
	union lb_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   pad;
	__u16  rev_nat_id;
};

struct maglev_result {
	__u32 hash;
	__u32 backend_id;
};

/* Index 0: the last run's result. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct maglev_result);
	__uint(max_entries, 1);
} maglev_result SEC(".maps");

SEC("xdp")
int maglev_select(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct maglev_flow f __align_stack_8;
	struct maglev_result *res;
	__u32 zero = 0;

	if (data + sizeof(f) > data_end)
		return XDP_ABORTED;
	__builtin_memcpy(&f, data, sizeof(f));
	res = bpf_map_lookup_elem(&maglev_result, &zero);
	if (!res)
		return XDP_ABORTED;
	res->hash = lb_maglev_flow_hash(&f.saddr, &f.daddr, f.sport, f.dport, f.proto);
	res->backend_id = lb_maglev_backend(f.rev_nat_id, res->hash);
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
