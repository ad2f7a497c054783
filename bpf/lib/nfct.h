/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flows netfilter already tracks stay netfilter's: the way in from
 * kube-proxy without a broken connection (docs/install.md, migrating).
 *
 * When sluice starts on a node where kube-proxy ran, every connection
 * kube-proxy balanced lives in netfilter's conntrack, with its DNAT (and a
 * masqueraded one's SNAT) bound in the entry. Those flows' packets meet
 * sluice's programs first, find no BPF state and look like flows picked up
 * mid-stream: balanced anew and masqueraded on another port, the backend
 * answers them with a RST. So a packet that would start a flow anywhere
 * but at its beginning (not a TCP SYN) first asks netfilter's conntrack
 * (bpf_skb_ct_lookup, bpf_xdp_ct_lookup: 5.18 and later, with
 * nf_conntrack loaded) for its tuple as it arrived. An entry there is a
 * flow netfilter translated before sluice did (sluice's own flows reach
 * the stack already translated, or not at all), so the packet goes to the
 * stack, where that entry translates it as before, with kube-proxy's
 * rules gone or not, until the flow ends. Nothing else changes: a SYN is
 * never handed over, and a flow netfilter does not know is sluice's.
 *
 * The kfuncs are weak: a kernel without them (or without nf_conntrack
 * loaded) loads the programs with the calls poisoned by the loader and
 * dropped by the verifier, which knows nf_ct_kfuncs is 0 then (the agent
 * sets it from its probe; sluice status says which). Not bpf_ksym_exists:
 * before 6.3 the verifier refuses the ld_imm64 of a kfunc's address that
 * it compiles to ("BPF_LD_IMM64 uses reserved fields", 6.1 with
 * nf_conntrack loaded).
 */
#ifndef __SLUICE_NFCT_H
#define __SLUICE_NFCT_H

#include "ctx.h"
#include "events_abi.h"
#include "l4.h"

/* struct bpf_ct_opts of 5.18+ (NF_BPF_CT_OPTS_SZ, 12 bytes; later
 * kernels take this size still). The loader matches a kfunc's types by
 * kind and name, a ___ suffix dropped: these are the kernel's to it. */
struct bpf_ct_opts___sl {
	__s32 netns_id;
	__s32 error;
	__u8  l4proto;
	__u8  dir;
	__u8  reserved[2];
};

#define SL_CT_OPTS_SZ    12
#define SL_CURRENT_NETNS (-1)

/* Opaque here: only passed back to bpf_ct_release. */
struct nf_conn___sl {
	int opaque;
};

/* 1 where the kernel has the kfuncs below, set by the agent before load
 * (probe.NFConntrackKfuncs). */
volatile const __u32 nf_ct_kfuncs = 0;

#ifdef SLUICE_TC
extern struct nf_conn___sl *bpf_skb_ct_lookup(struct __sk_buff *ctx, struct bpf_sock_tuple *tuple,
					      __u32 tuple__sz, struct bpf_ct_opts___sl *opts,
					      __u32 opts__sz) __ksym __weak;
#define sl_ct_lookup bpf_skb_ct_lookup
#else
extern struct nf_conn___sl *bpf_xdp_ct_lookup(struct xdp_md *ctx, struct bpf_sock_tuple *tuple,
					      __u32 tuple__sz, struct bpf_ct_opts___sl *opts,
					      __u32 opts__sz) __ksym __weak;
#define sl_ct_lookup bpf_xdp_ct_lookup
#endif
extern void bpf_ct_release(struct nf_conn___sl *ct) __ksym __weak;

/* Packets netfilter's conntrack took over from sluice ([0]), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct sl_drop_count);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sl_nf_handoff SEC(".maps");

/* ns_nf_tracked: netfilter's conntrack has the flow of p (TCP or UDP, its
 * tuple as it arrived), of len bytes, which then goes to the stack,
 * counted: 1. 0 when it has not, or the kernel cannot say. A global
 * function, verified once: a flow's first packet that is not a SYN. */
__noinline int ns_nf_tracked(struct __ctx_buff *ctx, const struct ns_pkt *p, __u32 len)
{
	struct bpf_ct_opts___sl opts = { .netns_id = SL_CURRENT_NETNS };
	struct bpf_sock_tuple t = {};
	const struct ns_config *cfg;
	struct sl_drop_count *c;
	struct nf_conn___sl *ct;
	__u32 zero = 0;
	__u32 sz;

	if (!p || !nf_ct_kfuncs)
		return 0;
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	cfg = ns_cfg();
	if (!cfg || (cfg->flags & NS_CFG_NO_NF_HANDOFF))
		return 0;
	opts.l4proto = p->proto;
	if (p->v6) {
		__builtin_memcpy(t.ipv6.saddr, p->saddr.b, 16);
		__builtin_memcpy(t.ipv6.daddr, p->daddr.b, 16);
		t.ipv6.sport = p->sport;
		t.ipv6.dport = p->dport;
		sz = sizeof(t.ipv6);
	} else {
		t.ipv4.saddr = p->saddr.w[3];
		t.ipv4.daddr = p->daddr.w[3];
		t.ipv4.sport = p->sport;
		t.ipv4.dport = p->dport;
		sz = sizeof(t.ipv4);
	}
	ct = sl_ct_lookup(ctx, &t, sz, &opts, SL_CT_OPTS_SZ);
	if (!ct)
		return 0;
	bpf_ct_release(ct);
	c = bpf_map_lookup_elem(&sl_nf_handoff, &zero);
	if (c) {
		c->packets++;
		c->bytes += len;
	}
	return 1;
}

#endif /* __SLUICE_NFCT_H */
