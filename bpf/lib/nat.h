/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* BPF masquerading (SNAT) of flows to remote backends.
 *
 * A mapping is two snat entries written together:
 *   NAT_DIR_EGRESS   client:cport -> backend:bport  gives  node IP:nat port
 *   NAT_DIR_INGRESS  backend:bport -> node:nat port gives  client:cport
 * The nat port is a keyed hash of the flow in [snat_port_min,
 * snat_port_max] less the hole (the NodePorts and the host's own ephemeral
 * ports), hashed again while the ingress tuple is taken (bounded): random
 * probes, not the next port, which in a range half full of a flood's ports
 * finds long runs of taken ones (linear probing's clusters); a range too
 * full for them is then searched port by port (snat_scan), so a SYN is
 * dropped as nat-exhausted only when every port to that backend is held.
 * A port whose flow is over is taken over at once (snat_port_free), as
 * netfilter reuses the tuples of closed connections, but not while the
 * backend holds it in TIME_WAIT, and by one CPU only: a compare and swap of
 * the mapping's word marks it taken (SNAT_TAKING), against another CPU's
 * take-over and against the old flow's client taking it back for a new
 * flow on the same tuple (snat_hold), which marks it too (SNAT_F_REUSED).
 * A new flow's mappings are in snat_new and move to snat (snat_any for UDP)
 * with its conntrack entries (ct_promote, ct_complete); a port is taken
 * when any table holds its ingress tuple. A TCP SYN writes only the
 * ingress mapping, its SYN-ACK's, in its slot of snat_half (ct.h,
 * ns_maps.h).
 */
#ifndef __SLUICE_NAT_H
#define __SLUICE_NAT_H

#include "csum.h"
#include "ct.h"

#define SNAT_PORT_MIN_DEFAULT 32768
#define SNAT_PORT_MAX_DEFAULT 65535
#define SNAT_RETRIES          32

/* snat_conf_addr is the configured SNAT source of the family. */
static __always_inline const union lb_addr *snat_conf_addr(const struct ns_config *cfg, bool v6)
{
	return (const union lb_addr *)(v6 ? cfg->snat_addr6 : cfg->snat_addr4);
}

/* snat_range_of gives the nat ports of cfg (struct snat_range, ns_maps.h). */
static __always_inline int snat_range_of(const struct ns_config *cfg, struct snat_range *r)
{
	__u32 max = or_default(cfg->snat_port_max, SNAT_PORT_MAX_DEFAULT);

	r->min = or_default(cfg->snat_port_min, SNAT_PORT_MIN_DEFAULT);
	if (max < r->min)
		return -1;
	r->size = max - r->min + 1;
	r->hole_min = cfg->snat_hole_min;
	r->hole_size = 0;
	if (r->hole_min > r->min && cfg->snat_hole_max >= r->hole_min && cfg->snat_hole_max < max)
		r->hole_size = cfg->snat_hole_max - r->hole_min + 1;
	r->size -= r->hole_size;
	return 0;
}

/* snat_port_at is the i-th nat port of r (i < r->size). */
static __always_inline __u32 snat_port_at(const struct snat_range *r, __u32 i)
{
	__u32 port = r->min + i;

	return port >= r->hole_min && r->hole_size ? port + r->hole_size : port;
}

/* snat_is_nat_port: port (network order) may be a nat port, where the
 * replies of masqueraded flows come to. Every port from 32768 stays one
 * whatever the range: mappings outlive the agent and a change of the range
 * (an upgrade, a new ip_local_port_range), so a port a flow took under an
 * earlier range (32768-65535, 61000-65535 before) keeps its replies. The
 * NodePorts and the well-known ports need no snat lookup. */
static __always_inline bool snat_is_nat_port(const struct ns_config *cfg, __be16 port)
{
	__u32 min = or_default(cfg->snat_port_min, SNAT_PORT_MIN_DEFAULT);
	__u32 p = bpf_ntohs(port);

	if (p >= SNAT_PORT_MIN_DEFAULT)
		return true;
	return p >= min && !(cfg->snat_hole_min && p >= cfg->snat_hole_min &&
			     p <= cfg->snat_hole_max);
}

/* snat_source is the node address a flow to backend leaves with, as
 * MASQUERADE takes the source of the route out: the source of the route to
 * it through another device (ns_snat_route: an overlay's, whose replies
 * come back through that device); else the configured one of the family
 * (the node's address, the source of the routes ns_snat_route leaves out);
 * else, with none of the family, the frontend itself when it is a node IP.
 * Not the frontend first: a NodePort on an address of another device (a
 * VLAN's, a second network's) is no address the backend's node routes
 * back to this node. */
static __always_inline int snat_source(const struct ns_config *cfg, bool v6,
				       const union lb_addr *frontend,
				       const union lb_addr *backend, union lb_addr *out)
{
	struct tunnel_key key = { .prefixlen = 128 };
	struct tunnel_val *route;

	__builtin_memcpy(key.addr, backend->b, sizeof(key.addr));
	route = bpf_map_lookup_elem(&ns_snat_route, &key);
	if (route) {
		__builtin_memcpy(out->b, route->node_addr, sizeof(out->b));
		return 0;
	}
	*out = *snat_conf_addr(cfg, v6);
	if (!addr_is_any(out))
		return 0;
	if (lb_is_node_addr(frontend)) {
		*out = *frontend;
		return 0;
	}
	return -1;
}

/* snat_put writes a mapping into the table of its flow (fresh: snat_new). */
static __always_inline int snat_put(const struct ct_tuple *t, const struct nat_entry *n,
				    bool fresh, __u64 uflags)
{
	if (fresh)
		return snat_new_update(t, n, uflags);
	return snat_est_update(t, n, uflags);
}

/* snat_port_free: the mapping n under the scratch's ingress tuple (tuple2:
 * backend:bport -> node:nat port), whose word (nat_word) was claim_word
 * when read, belongs to a flow that is over at CT second claim_now, so
 * another client may take its port: its ingress entry (tuple3, built
 * here) is dead; or it was reset; or both sides sent their
 * FIN, the client's first, and the last packet passed two CT seconds ago
 * (one second at least): the backend was in LAST_ACK until the client's
 * last ACK reached it, a round trip after its FIN, and a SYN on the tuple
 * before then meets that socket (a challenge ACK, the client's RST: a
 * failed connect, seen at 2,000 short connections a second when ports went
 * at the backend's FIN). A backend that closed first holds the tuple in
 * TIME_WAIT, where a SYN with another client's TCP timestamps fails PAWS
 * about half the time (a challenge ACK, a RST, a retry a second later):
 * its entry lives CT_TIME_WAIT past the close (ct.h), and the port waits
 * that long. A mapping without an ingress entry is free after the agent's
 * GC grace (two CT seconds: its flow's entries may have been written just
 * after it), and so is one its client took back (SNAT_F_REUSED): until
 * then the entry found may be the last flow's, closed, while the new flow
 * on the same tuple is about to write its own. One being taken over
 * (SNAT_TAKING) is not free twice. */
static __always_inline bool snat_port_free(struct ct_scratch *s, const struct nat_entry *n)
{
	const struct ns_config *cfg;
	const struct ct_entry *in;
	__u32 created = nat_word_created(s->claim_word);

	if (created == SNAT_TAKING ||
	    ((nat_word_flags(s->claim_word) & SNAT_F_REUSED) && created + 2 >= s->claim_now))
		return false;
	ct_tuple_set(&s->tuple3, (const union lb_addr *)n->to_addr,
		     (const union lb_addr *)s->tuple2.saddr, n->to_port, s->tuple2.sport,
		     s->tuple2.proto, CT_DIR_INGRESS);
	/* From the scratch again after the lookup: few values live across
	 * it, and snat_claim's frame stays one 32-byte step of 6.1's. */
	s->taken_hash = half_hash(&s->tuple3);
	in = ct_lookup_in_h(&s->tuple3, &s->taken_hash);
	if (!in)
		return nat_word_created(s->claim_word) + 2 < s->claim_now;
	if (in->lifetime < s->claim_now)
		return true;
	if (s->tuple2.proto != IPPROTO_TCP || !(in->flags & CT_F_CLOSING))
		return false;
	if (in->flags & CT_F_RST)
		return true;
	if ((in->flags & (CT_F_FIN_REPLY | CT_F_TW_BACKEND)) != CT_F_FIN_REPLY || !(cfg = ns_cfg()))
		return false;
	/* The last packet came at lifetime less the close timeout. */
	return in->lifetime + 2 <= s->claim_now + or_default(cfg->tcp_close_timeout, CT_DEFAULT_TCP_CLOSE);
}

/* snat_hold keeps the ingress mapping n, which names this flow's client,
 * for a new flow of that client (its SYN on the tuple of a flow that is
 * over; a mapping found again): marked taken back at now (SNAT_F_REUSED),
 * the port is not free (snat_port_free) in the two CT seconds the flow's
 * conntrack entries take to replace the last flow's. A CPU that read the
 * word before finds it changed and leaves the port (snat_claim). false
 * when another CPU is taking the port over (SNAT_TAKING): the flow finds
 * another. One compare and swap a CT second at most. */
static __always_inline bool snat_hold(struct ct_scratch *s, struct nat_entry *n, __u32 now)
{
	/* The word found and the one wanted live in the scratch: snat_claim's
	 * frame stays one 32-byte step of 6.1's rounding. */
	s->claim_word = READ_ONCE(*nat_word(n));
	if (nat_word_created(s->claim_word) == SNAT_TAKING)
		return false;
	s->hold_word = nat_word_with(s->claim_word, nat_word_flags(s->claim_word) | SNAT_F_REUSED, now);
	if (s->claim_word == s->hold_word ||
	    __sync_val_compare_and_swap(nat_word(n), s->claim_word, s->hold_word) == s->claim_word)
		return true;
	/* Changed meanwhile: taken back on another CPU too (the same SYN
	 * sent again), or being taken over. */
	return nat_word_created(READ_ONCE(*nat_word(n))) != SNAT_TAKING;
}

/* The table a claim writes (snat_claim_args): an established flow's, a
 * new flow's (snat_new), a half-open TCP flow's (its slot of snat_half). */
#define SNAT_CLAIM_EST  0
#define SNAT_CLAIM_NEW  1
#define SNAT_CLAIM_HALF 2

/* snat_claim_fence orders a claim's write before its checks of the other
 * tables (a full barrier: an atomic add that fetches, a locked instruction
 * on x86, acquire and release on arm64): a table's write otherwise ends
 * in a store (its bucket's unlock) that a later load may pass, and two
 * CPUs each claiming the tuple into another table could each read the
 * other's table before the other's write shows, and both win. A slot's
 * write ends in one already (half_unlock). The CPU's scratch word: no line
 * shared. */
static __always_inline void snat_claim_fence(struct ct_scratch *s)
{
	__u64 v = __sync_fetch_and_add(&s->claim_fence, 1);

	barrier_var(v); /* used: an add that fetches (BPF_FETCH) */
}

/* snat_try_claim takes the scratch's ingress tuple (tuple2) for the
 * mapping in its nat, in the table of its flow (SNAT_CLAIM_*), unless any
 * table has it: 0 when taken. It claims first and then checks the other
 * tables, undoing its claim on a hit: two claims of one tuple racing on two
 * CPUs into two tables (or a claim racing snat_move of the same tuple) can
 * then both fail, for the next port, but never both succeed and map one
 * port to two clients (snat_claim_fence between the claim and the checks).
 * Claims into one table are one insert that fails if the key is there (for
 * a slot, half_put's compare and swap). */
static __always_inline int snat_try_claim(struct ct_scratch *s, __u32 table)
{
	const struct ct_tuple *t = &s->tuple2;

	/* One hash for the slot, the flow filter's bits and the writes'. */
	s->claim_hash = half_hash(t);
	if (table == SNAT_CLAIM_HALF) {
		if (half_put(t, &s->nat, 1, true, half_idx_h(t, 1, s->claim_hash)))
			return -1;
		if (!snat_est_lookup_h(t, s->claim_hash) && !snat_new_lookup_h(t, s->claim_hash))
			return 0;
		half_clear(t, 1);
		return -1;
	}
	if (table == SNAT_CLAIM_NEW) {
		if (snat_new_update_h(t, &s->nat, BPF_NOEXIST, s->claim_hash))
			return -1;
		snat_claim_fence(s);
		if (!snat_est_lookup_h(t, s->claim_hash) && !snat_half_lookup_h(t, s->claim_hash))
			return 0;
		bpf_map_delete_elem(&snat_new, t);
		return -1;
	}
	if (snat_est_update_h(t, &s->nat, BPF_NOEXIST, s->claim_hash))
		return -1;
	snat_claim_fence(s);
	if (!snat_half_lookup_h(t, s->claim_hash) && !snat_new_lookup_h(t, s->claim_hash))
		return 0;
	snat_est_delete(t);
	return -1;
}

/* snat_claim claims the scratch's ingress tuple (tuple2) for the mapping
 * in its nat (snat_try_claim), in the table claim_fresh says, at CT second
 * claim_now (the scratch's, set by snat_claim_args: this frame stays one
 * 32-byte step of 6.1's rounding): 0 when this flow has it. A tuple held for
 * the same client already is its own (a SYN sent again, a flow made again
 * after its entries were evicted), held for it (snat_hold). One held by a flow that is over
 * (snat_port_free at CT second now) is taken over: that flow's mappings go,
 * and the claim is tried once more. A global function: verified once, a
 * return of unknown value to its callers (the retry loop's paths stay few).
 * Key and value come from the scratch, a map value: 6.1's verifier takes
 * no other memory as a map key in a global function. */
__noinline int snat_claim(void)
{
	struct ct_scratch *s = ns_scratch();
	struct nat_entry *n;

	if (!s)
		return -1;
	if (!snat_try_claim(s, s->claim_fresh))
		return 0;
	n = snat_lookup_in_h(&s->tuple2, &s->claim_hash); /* snat_try_claim hashed it */
	if (!n)
		return snat_try_claim(s, s->claim_fresh);
	if (n->to_port == s->nat.to_port &&
	    addr_equal((const union lb_addr *)s->nat.to_addr, n->to_addr))
		return snat_hold(s, n, s->claim_now) ? 0 : -1;
	s->claim_word = READ_ONCE(*nat_word(n));
	if (!snat_port_free(s, n))
		return -1;
	/* The port is this CPU's to take over only while the word is still
	 * the one found free: another CPU may have taken the port over
	 * meanwhile (and claimed it for a new flow, whose mapping the deletes
	 * below would take), or the old flow's client taken it back for a new
	 * flow (snat_hold) whose conntrack entries are not written yet. Its
	 * client's ACK would then find its flow gone, and the backend reset
	 * the connection (bench conns on tc before the recheck this replaces:
	 * 1 connection in 80,000 at 2,000 a second). Marked SNAT_TAKING, the mapping is neither free nor
	 * taken back elsewhere until it goes. */
	if (__sync_val_compare_and_swap(nat_word(n), s->claim_word,
					nat_word_with(s->claim_word, nat_word_flags(s->claim_word),
						      SNAT_TAKING)) != s->claim_word)
		return -1;
	/* The old flow's egress mapping (client -> backend), while it still
	 * gives this port: its key is in tuple3, less the direction. */
	s->tuple3.dir = NAT_DIR_EGRESS;
	n = snat_lookup(&s->tuple3);
	if (n && n->to_port == s->tuple2.dport) {
		snat_est_delete(&s->tuple3);
		bpf_map_delete_elem(&snat_new, &s->tuple3);
	}
	snat_est_delete(&s->tuple2);
	snat_new_delete_i(&s->tuple2);
	return snat_try_claim(s, s->claim_fresh);
}

/* snat_claim_args sets snat_claim's arguments in the scratch s: the
 * table of a new flow (fresh) or an established one's, and the CT second. */
static __always_inline void snat_claim_args(struct ct_scratch *s, bool fresh, __u32 now)
{
	s->claim_fresh = fresh ? SNAT_CLAIM_NEW : SNAT_CLAIM_EST;
	s->claim_now = now;
}

static long snat_scan_step(__u64 i, void *unused)
{
	struct ct_scratch *s = ns_scratch();
	struct snat_scan *c;
	__u32 idx;

	if (!s)
		return 1;
	c = &s->scan;
	if (!c->r.size)
		return 1;
	idx = c->start + (__u32)i;
	if (idx >= c->r.size)
		idx -= c->r.size;
	s->tuple2.dport = bpf_htons(snat_port_at(&c->r, idx));
	if (snat_claim())
		return 0;
	c->claimed = 1;
	return 1;
}

/* snat_scan claims, for the ingress tuple in the scratch's tuple2, the
 * first free port of the range r from a random one on, every port once at
 * most (bpf_loop): where SNAT_RETRIES random probes found every port they
 * tried taken, the range is nearly full, and a port still free is found
 * here if there is one (snat_claim's arguments set as for them). 0 when
 * claimed (tuple2.dport the port). Its state
 * is in the scratch, not on the stack: bpf_loop's steps are frames of
 * their own on the service path's chain. */
static __noinline int snat_scan(const struct snat_range *r)
{
	struct ct_scratch *s = ns_scratch();

	if (!s || !r || !r->size)
		return -1;
	s->scan.r = *r;
	s->scan.start = bpf_get_prandom_u32() % r->size;
	s->scan.claimed = 0;
	bpf_loop(r->size, snat_scan_step, NULL, 0);
	return s->scan.claimed ? 0 : -1;
}

/* snat_reuse checks the egress mapping of p (client -> backend, after
 * DNAT) found under s->tuple and copied into s->nat: its ingress mapping
 * (what the replies need; the two are evicted apart) must give p's client,
 * held for this flow (snat_hold), and is written back into the flow's table
 * (fresh: snat_new) when it is gone. 0 leaves the egress mapping in s->nat; -1 when the port went to
 * another flow meanwhile: the stale mapping is deleted, for a new one. */
static __noinline int snat_reuse(const struct ns_pkt *p, struct ct_scratch *s, bool fresh,
				 __u32 now)
{
	struct nat_entry *n;

	if (!p || !s)
		return -1;
	ct_tuple_set(&s->tuple2, &p->daddr, (const union lb_addr *)s->nat.to_addr, p->dport,
		     s->nat.to_port, p->proto, NAT_DIR_INGRESS);
	n = snat_lookup_in(&s->tuple2);
	if (n) {
		if (n->to_port == p->sport && addr_equal(&p->saddr, n->to_addr) &&
		    snat_hold(s, n, now))
			return 0;
	} else {
		__builtin_memcpy(s->nat.to_addr, p->saddr.b, sizeof(s->nat.to_addr));
		s->nat.to_port = p->sport;
		snat_claim_args(s, fresh, now);
		if (!snat_claim()) {
			/* Back to the egress mapping: its key's node and port. */
			__builtin_memcpy(s->nat.to_addr, s->tuple2.daddr, sizeof(s->nat.to_addr));
			s->nat.to_port = s->tuple2.dport;
			return 0;
		}
	}
	snat_est_delete(&s->tuple);
	bpf_map_delete_elem(&snat_new, &s->tuple);
	return -1;
}

/* snat_egress finds or allocates the mapping of p (client -> backend,
 * after DNAT) and rewrites its source to the node IP and nat port; a new
 * mapping goes into the table of the flow's CT entry (fresh: a new flow's,
 * snat_new). half: a half-open TCP flow's (a SYN, ct.h), which needs only
 * the ingress mapping until its handshake completes. Its keys and values
 * are built in the per-CPU scratch: a new flow's path would otherwise be
 * the deepest of the service path's frame. */
static __always_inline int snat_egress(struct __ctx_buff *ctx, struct ns_pkt *p,
				       const struct ns_config *cfg,
				       const union lb_addr *frontend, __u32 hash, __u32 now,
				       bool fresh, bool half)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_tuple *out, *in;
	union lb_addr node __align_stack_8;
	struct snat_range r;
	struct nat_entry *n;
	int i;

	if (!s)
		return -1;
	out = &s->tuple;
	in = &s->tuple2;
	ct_tuple_set(out, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     NAT_DIR_EGRESS);
	/* A SYN's half-open flow whose tuple no conntrack entry has
	 * (ct_clash_sport) has no mapping to reuse: an egress mapping is
	 * made when a flow completes, and one left by a flow whose entries
	 * are gone names a port the takeover rules free (snat_port_free).
	 * Two lookups of absent keys fewer on a new flow's path. */
	n = half && !s->in_seen ? NULL : snat_lookup(out);
	if (n) {
		/* The scratch's nat is the flow's mapping for ct_note_snat. */
		__builtin_memcpy(&s->nat, n, sizeof(s->nat));
		if (!snat_reuse(p, s, fresh, now)) {
			__builtin_memcpy(node.b, s->nat.to_addr, sizeof(node.b));
			return pkt_rewrite(ctx, p, false, &node, s->nat.to_port);
		}
	}

	if (snat_source(cfg, p->v6, frontend, &p->daddr, &node) || snat_range_of(cfg, &r) || !r.size)
		return -1;

	/* The reverse mapping: backend -> node:nat port gives the client. */
	__builtin_memcpy(s->nat.to_addr, p->saddr.b, sizeof(s->nat.to_addr));
	s->nat.to_port = p->sport;
	s->nat.flags = 0;
	s->nat.created = now;
	ct_tuple_set(in, &p->daddr, &node, p->dport, 0, p->proto, NAT_DIR_INGRESS);
	snat_claim_args(s, fresh, now);
	/* A SYN's: its slot (ns_maps.h), as ct_put_flow's ingress entry. */
	if (half && fresh)
		s->claim_fresh = SNAT_CLAIM_HALF;
	for (i = 0; i < SNAT_RETRIES; i++) {
		in->dport = bpf_htons(snat_port_at(&r, hash % r.size));
		if (!snat_claim() /* in is the scratch's tuple2 */)
			break;
		hash = hash_fmix32(hash + 0x9e3779b9);
	}
	if (i == SNAT_RETRIES && snat_scan(&r))
		return -1;

	/* The forward mapping: gives node IP and nat port. */
	__builtin_memcpy(s->nat.to_addr, node.b, sizeof(s->nat.to_addr));
	s->nat.to_port = in->dport;
	if (!half && snat_put(out, &s->nat, fresh, BPF_ANY)) {
		if (fresh)
			bpf_map_delete_elem(&snat_new, in);
		else
			snat_est_delete(in);
		return -1;
	}
	return pkt_rewrite(ctx, p, false, &node, s->nat.to_port);
}

/* snat_copy_source is the source address of a flow whose service entry e
 * holds a copy of its nat port: the frontend (before DNAT), or the
 * configured one. */
static __always_inline const union lb_addr *snat_copy_source(const struct ns_config *cfg,
							     const struct ct_entry *e, bool v6,
							     const union lb_addr *frontend)
{
	return (e->flags & CT_F_SNAT_FE) ? frontend : snat_conf_addr(cfg, v6);
}

/* snat_cache copies the egress mapping n of a flow to frontend into its
 * service entry e, so later packets need no snat lookup. A mapping from
 * neither the frontend nor the configured address is left uncached. */
static __always_inline void snat_cache(const struct ns_config *cfg, struct ct_entry *e,
				       bool v6, const union lb_addr *frontend,
				       const struct nat_entry *n)
{
	__u16 flags = e->flags;

	/* snat_port holds the client port given (ct_snat_copy). */
	if (flags & CT_F_SPORT)
		return;
	if (addr_equal(frontend, n->to_addr))
		flags |= CT_F_SNAT_FE;
	else if (addr_equal(snat_conf_addr(cfg, v6), n->to_addr))
		flags &= ~CT_F_SNAT_FE;
	else
		return;
	if (flags != e->flags)
		WRITE_ONCE(e->flags, flags);
	WRITE_ONCE(e->snat_port, n->to_port);
}

/* ct_note_snat copies the mapping snat_egress just made for a new flow
 * (in the scratch's nat) into the flow's service entry (the scratch's
 * svc_key, from ct_create_flow), as snat_cache does for an established
 * flow: under a flood, the new flows' mappings may be evicted before the
 * client completes its handshake, and the copy keeps the flow's nat port
 * (its next packets translate with it, snat_refresh writes the mappings
 * back). A half-open flow (half, ct.h) has no service entry: the copy goes
 * into its ingress entry (half_key), which ct_complete reads it from.
 * frontend is the flow's, v6 its family. A global function, off the
 * established flows' path. */
__noinline int ct_note_snat(const union lb_addr *frontend, __u32 v6, __u32 half)
{
	struct ct_scratch *s = ns_scratch();
	const struct ns_config *cfg = ns_cfg();
	struct ct_entry *e;

	if (!s || !cfg || !frontend)
		return 0;
	/* A half-open flow's slot, from ct_clash_sport: no hash again. */
	e = half ? ct_half_at(s->half_idx, &s->half_key) : NULL;
	if (!e)
		e = ct_new_lookup(half ? &s->half_key : &s->svc_key);
	if (e)
		snat_cache(cfg, e, v6, frontend, &s->nat);
	return 0;
}

/* snat_refresh checks, once a CT second, the mapping that the service
 * entry e of flow p (before DNAT) holds a copy of. When the mapping is gone
 * (LRU eviction, or the agent's GC while the ingress entry was missing) it
 * writes it back with the same port, so the flow keeps its source; when it
 * differs, or the port has been taken since, the copy is dropped and the
 * next packet looks the mapping up (or allocates one). Not inlined, with
 * its keys in the caller's per-CPU scratch s: its values stay out of the
 * service path's frame, and its own fits one 32-byte step of 6.1's
 * rounding (ns_maps.h). */
static __noinline void snat_refresh(const struct ns_config *cfg, struct ct_entry *e,
				    const struct ns_pkt *p, struct ct_scratch *s, __u32 now)
{
	const union lb_addr *node;
	const struct nat_entry *n;
	bool fresh;

	if (!(e->flags & CT_F_SNAT) || !ct_snat_copy(e))
		return;
	node = snat_copy_source(cfg, e, p->v6, &p->daddr);
	/* Both keys and the ingress value first: few values live across the
	 * map calls, and this frame stays small. */
	ct_tuple_set(&s->tuple2, (const union lb_addr *)e->nat_addr, node, e->nat_port,
		     e->snat_port, p->proto, NAT_DIR_INGRESS);
	ct_tuple_set(&s->tuple, &p->saddr, (const union lb_addr *)e->nat_addr, p->sport,
		     e->nat_port, p->proto, NAT_DIR_EGRESS);
	__builtin_memcpy(s->nat.to_addr, p->saddr.b, sizeof(s->nat.to_addr));
	s->nat.to_port = p->sport;
	s->nat.flags = 0;
	s->nat.created = e->created;

	fresh = e->flags & CT_F_NEW;
	n = snat_lookup(&s->tuple);
	if (n) {
		if (n->to_port != e->snat_port ||
		    !addr_equal((const union lb_addr *)s->tuple2.daddr, n->to_addr)) {
			WRITE_ONCE(e->snat_port, 0);
			return;
		}
		/* The ingress mapping may have been evicted alone. */
		n = snat_lookup_in(&s->tuple2);
		snat_claim_args(s, fresh, now);
		if (n ? n->to_port != p->sport || !addr_equal(&p->saddr, n->to_addr) :
			snat_claim())
			WRITE_ONCE(e->snat_port, 0); /* the port went to another flow */
		return;
	}
	snat_claim_args(s, fresh, now);
	if (snat_claim()) {
		n = snat_lookup_in(&s->tuple2);
		if (!n || n->to_port != p->sport || !addr_equal(&p->saddr, n->to_addr)) {
			WRITE_ONCE(e->snat_port, 0); /* the port went to another flow */
			return;
		}
	}
	__builtin_memcpy(s->nat.to_addr, s->tuple2.daddr, sizeof(s->nat.to_addr));
	s->nat.to_port = e->snat_port;
	if (snat_put(&s->tuple, &s->nat, fresh, BPF_ANY))
		WRITE_ONCE(e->snat_port, 0);
}

/* ct_move moves the entry under key t from the new flows' tables (its
 * slot of ct_half, or ct_new) to ct, with CT_F_NEW cleared, staged in
 * s->entry. Written first, deleted after: a packet in between finds it in
 * ct, or in both. */
static __always_inline int ct_move(const struct ct_tuple *t, struct ct_scratch *s)
{
	struct ct_entry *e = ct_half_lookup(t);
	bool half = e;

	if (!e)
		e = bpf_map_lookup_elem(&ct_new, t);
	if (!e)
		return -1;
	__builtin_memcpy(&s->entry, e, sizeof(s->entry));
	s->entry.flags &= ~CT_F_NEW;
	if (ct_est_update(t, &s->entry, BPF_ANY))
		return -1;
	if (half)
		ct_half_delete(t);
	else
		bpf_map_delete_elem(&ct_new, t);
	return 0;
}

/* snat_move moves the mapping under key t from the new flows' tables (its
 * slot of snat_half, or snat_new) to snat, and returns a copy in s->nat. */
static __always_inline int snat_move(const struct ct_tuple *t, struct ct_scratch *s)
{
	struct nat_entry *n = snat_half_lookup(t);
	bool half = n;

	if (!n)
		n = bpf_map_lookup_elem(&snat_new, t);
	if (!n)
		return -1;
	__builtin_memcpy(&s->nat, n, sizeof(s->nat));
	if (snat_est_update(t, &s->nat, BPF_ANY))
		return -1;
	if (half)
		snat_half_delete(t);
	else
		bpf_map_delete_elem(&snat_new, t);
	return 0;
}

/* ct_promote moves the flow of p (the client's packet, before DNAT) from
 * the new flows' tables to the established ones (ct.h): both CT entries
 * and, for SNAT, both mappings. It returns 0 when the service entry moved,
 * its key left in the scratch's tuple, else -1 (the flow stays new, tried
 * again by its next packet). Whatever piece is missing (evicted from
 * ct_new) comes back as for an established flow (ct_restore_ingress,
 * snat_refresh). A global function, verified once: the service path calls
 * it from two places, and its keys and values live in the scratch. */
__noinline int ct_promote(const struct ns_pkt *p)
{
	const struct ct_entry *e;
	struct ct_entry *in;
	struct ct_scratch *s;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&ns_scratch_map, &zero);
	if (!s || !p)
		return -1;
	ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	/* Not before the backend answered, where its replies cross here. */
	e = bpf_map_lookup_elem(&ct_new, &s->tuple);
	if (!e)
		return -1;
	if (ct_has_ingress(e)) {
		ct_ingress_tuple(&s->tuple2, p, e);
		e = ct_lookup_in(&s->tuple2);
		if (!e || (e->flags & (CT_F_SEEN_REPLY | CT_F_CLOSING)) != CT_F_SEEN_REPLY)
			return -1;
		/* TCP: the client acknowledged the backend's SYN-ACK, exactly
		 * (its ack, in the scratch from ct_promote_if_ready). */
		if (p->proto == IPPROTO_TCP && e->alive_at && !ct_acks_syn_ack(e, s->ack_seq))
			return -1;
	}
	if (ct_move(&s->tuple, s))
		return -1;
	/* s->entry is the service entry now. Its SNAT mappings first: the
	 * egress one (client -> backend) gives the ingress one's key. */
	if (s->entry.flags & CT_F_SNAT) {
		ct_tuple_set(&s->tuple2, &p->saddr, (const union lb_addr *)s->entry.nat_addr,
			     ct_client_port(&s->entry, p->sport), s->entry.nat_port, p->proto,
			     NAT_DIR_EGRESS);
		if (snat_move(&s->tuple2, s)) {
			/* The egress mapping is gone: the entry's copy of it
			 * gives the ingress mapping's key. */
			const struct ns_config *cfg = ns_cfg();

			if (!cfg || !ct_snat_copy(&s->entry))
				goto ingress;
			__builtin_memcpy(s->nat.to_addr,
					 snat_copy_source(cfg, &s->entry, p->v6, &p->daddr)->b,
					 sizeof(s->nat.to_addr));
			s->nat.to_port = s->entry.snat_port;
		}
		ct_tuple_set(&s->tuple2, (const union lb_addr *)s->entry.nat_addr,
			     (const union lb_addr *)s->nat.to_addr, s->entry.nat_port,
			     s->nat.to_port, p->proto, NAT_DIR_INGRESS);
		snat_move(&s->tuple2, s);
	}
ingress:
	if (ct_has_ingress(&s->entry)) {
		ct_ingress_tuple(&s->tuple2, p, &s->entry);
		in = ct_new_lookup(&s->tuple2);
		if (in && p->proto == IPPROTO_TCP)
			in->flags |= CT_F_ESTABLISHED; /* as its service entry */
		ct_move(&s->tuple2, s);
	}
	return 0;
}

/* ct_promote_if_ready moves the new flow of p whose service entry *e this
 * packet established (ct_ready) to the established flows' tables, and
 * points *e to the entry's new place: true when it moved (the flow's
 * snat_new pointers are stale then). */
static __always_inline bool ct_promote_if_ready(struct __ctx_buff *ctx, const struct ns_pkt *p,
						struct ct_entry **e, __u32 now)
{
	struct ct_scratch *s;
	struct ct_entry *moved;

	if (!ct_ready(*e, p->proto, now))
		return false;
	s = ns_scratch();
	if (!s)
		return false;
	if (p->proto == IPPROTO_TCP) {
		if (ctx_load_bytes(ctx, p->l4_off + 8, &s->ack_seq, sizeof(s->ack_seq)))
			return false;
		s->ack_seq = bpf_ntohl(s->ack_seq);
	}
	if (ct_promote(p))
		return false;
	moved = ct_est_lookup(&s->tuple);
	if (moved)
		*e = moved;
	return true;
}

/* ct_half_nat sets the scratch's nat to where a packet of the half-open
 * flow whose ingress entry has flags and snat_port leaves from, for
 * ns_half_forward: the node (or frontend) address and nat port of a
 * masqueraded flow, a 0 port for a local backend. */
static __always_inline void ct_half_nat(struct ct_scratch *s, const struct ns_config *cfg,
					const struct ns_pkt *p, __u16 flags, __be16 snat_port)
{
	const union lb_addr *node;

	s->nat.to_port = (flags & CT_F_SNAT) ? snat_port : 0;
	node = (flags & CT_F_SNAT_FE) ? &p->daddr : snat_conf_addr(cfg, p->v6);
	__builtin_memcpy(s->nat.to_addr, node->b, sizeof(s->nat.to_addr));
}

/* ct_completed_meanwhile: the half-open flow of p (its ingress entry's key
 * in the scratch's tuple2), gone from ct_new, completed on another CPU
 * after ns_established missed it (ct_complete_svc writes the service
 * entry, then moves the ingress entry): 3, the service entry's key in the
 * scratch's tuple, when both are established; 0 otherwise (p starts a
 * flow mid-stream). */
static __always_inline int ct_completed_meanwhile(const struct ns_pkt *p, struct ct_scratch *s)
{
	const struct ct_entry *in = ct_est_lookup(&s->tuple2);

	if (!in || !(in->flags & CT_F_ESTABLISHED) || !ct_ingress_of(in, p))
		return 0;
	ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	return ct_est_lookup(&s->tuple) ? 3 : 0;
}

/* ct_complete completes the half-open TCP flow (ct.h) of the client's
 * packet p (not a SYN; its ack in the scratch's ack_seq) to the backend the
 * flow's hash picks again, whose ingress entry's key is in the scratch's
 * tuple2 (an address passed in would pin the caller's variable to a stack
 * slot of its own), when p acknowledges the backend's SYN-ACK exactly: a
 * masqueraded flow's reply mapping moves to the established table (or,
 * evicted meanwhile, is claimed again) and its egress mapping is made
 * there; ct_complete_svc then makes its service entry. It returns 1 then
 * (the ingress entry's key kept in half_key), 0 when p's flow has no
 * half-open state (p starts a flow mid-stream, as when a port its half-open
 * flow held went to another flow meanwhile), -1 when it has but p is not
 * the handshake's ACK: a blind ACK, which nf_conntrack would take as
 * INVALID and kube-proxy drops; 2 when p goes on to the backend as the
 * half-open flow's packets are translated, with no state made
 * (ns_half_forward): the client's RST, which closes the half-open state,
 * or a packet whose flow another CPU is completing; 3 when another CPU
 * completed it (ct_completed_meanwhile). One CPU completes a flow: the
 * client's ACK and its first data leave it at once from two CPUs (the
 * kernel sends the ACK on the CPU the SYN-ACK reached, the application its
 * request from its own), and two completions, each moving what the other
 * reads, left one of them starting the flow anew on another nat port
 * (bench conns on tc: 15 of 80,000 connections reset at 2,000 a second).
 * A global function, verified once, off the established flows' path; two,
 * so that neither frame holds all the values of both halves. */
__noinline int ct_complete(const struct ns_pkt *p)
{
	struct ct_scratch *s = ns_scratch();
	const struct ns_config *cfg = ns_cfg();
	const union lb_addr *node;
	struct ct_entry *in;
	__u64 ack_word;
	__be16 nat_port;
	__u16 flags;

	if (!s || !cfg || !p)
		return 0;
	s->claim_now = ct_now(cfg);
	__builtin_memcpy(&s->half_key, &s->tuple2, sizeof(s->half_key));
	in = ct_new_lookup(&s->tuple2);
	if (!in)
		return ct_completed_meanwhile(p, s);
	/* Past its lifetime, the half-open flow is gone (its slot is not
	 * collected: a SYN or this flow, picked up mid-stream, takes it). */
	if (in->lifetime < s->claim_now)
		return 0;
	if ((in->flags & CT_F_SPORT) || !ct_ingress_of(in, p))
		return 0;
	if ((in->flags & (CT_F_SEEN_REPLY | CT_F_CLOSING)) != CT_F_SEEN_REPLY ||
	    !ct_acks_syn_ack(in, s->ack_seq)) {
		if (!(p->tcp_flags & TCP_FLAG_RST))
			return -1;
		/* The client's RST goes on to the backend, which checks its
		 * sequence (RFC 5961) as the client's stack had it: it answers
		 * what the backend sent, a SYN-ACK, or the ACK a socket it
		 * still holds on the tuple sent for a SYN (a flood's half-open
		 * connection on a nat port handed on, with its SYN-ACK
		 * retries for a minute), which the RST clears. The half-open
		 * state closes. */
		flags = in->flags | CT_F_CLOSING | CT_F_RST;
		WRITE_ONCE(in->flags, flags);
		WRITE_ONCE(in->lifetime, s->claim_now + ct_timeout(cfg, p->proto, flags));
		ct_half_nat(s, cfg, p, flags, in->snat_port);
		return 2;
	}
	/* Another CPU took this flow's completion: p goes on as the
	 * half-open flow's packets are translated, meanwhile. (A SYN-ACK
	 * of another sequence changing ack_prev at that instant fails the
	 * swap too: p goes on so, and the next packet completes.) */
	ack_word = READ_ONCE(*ct_ack_word(in)) & 0xffffffffULL; /* completing 0 */
	if (__sync_val_compare_and_swap(ct_ack_word(in), ack_word, ack_word | (1ULL << 32)) != ack_word) {
		ct_half_nat(s, cfg, p, in->flags, in->snat_port);
		return 2;
	}
	nat_port = (in->flags & CT_F_SNAT) ? in->snat_port : 0;
	if (!nat_port)
		return 1;
	node = (in->flags & CT_F_SNAT_FE) ? &p->daddr : snat_conf_addr(cfg, p->v6);
	/* The reply mapping first: it moves to the established table, or,
	 * evicted meanwhile (a flood churns snat_new), is claimed again; a
	 * port another flow took since leaves this one to start anew (0), as
	 * one picked up mid-stream, and the next packet to complete it. */
	ct_tuple_set(&s->tuple2, (const union lb_addr *)s->half_key.daddr, node,
		     s->half_key.dport, nat_port, p->proto, NAT_DIR_INGRESS);
	if (snat_move(&s->tuple2, s)) {
		__builtin_memcpy(s->nat.to_addr, p->saddr.b, sizeof(s->nat.to_addr));
		s->nat.to_port = p->sport;
		s->nat.flags = 0;
		s->nat.created = s->claim_now;
		s->claim_fresh = SNAT_CLAIM_EST;
		if (snat_claim()) {
			in = ct_new_lookup(&s->half_key);
			if (in)
				WRITE_ONCE(in->completing, 0);
			return 0;
		}
	}
	/* The egress mapping: client -> backend gives node:nat port. */
	__builtin_memcpy(s->nat.to_addr, s->tuple2.daddr, sizeof(s->nat.to_addr));
	s->nat.to_port = s->tuple2.dport;
	s->nat.flags = 0;
	s->nat.created = s->claim_now;
	ct_tuple_set(&s->tuple2, &p->saddr, (const union lb_addr *)s->half_key.daddr, p->sport,
		     s->half_key.dport, p->proto, NAT_DIR_EGRESS);
	snat_est_update(&s->tuple2, &s->nat, BPF_ANY);
	return 1;
}

/* ct_complete_svc makes the service entry of the half-open flow of p that
 * ct_complete found complete (its ingress entry's key in the scratch's
 * half_key, the CT second in claim_now), of len bytes, in the established
 * table, and moves the ingress entry there. 1 when made (the service
 * entry's key in the scratch's tuple), else 0. */
__noinline int ct_complete_svc(const struct ns_pkt *p, __u32 len)
{
	struct ct_scratch *s = ns_scratch();
	const struct ns_config *cfg = ns_cfg();
	struct ct_entry *in, *e;

	if (!s || !cfg || !p)
		return 0;
	in = ct_new_lookup(&s->half_key);
	if (!in)
		return 0;
	/* The SYN and this packet, established (its replies are the ingress
	 * entry's to count). */
	e = &s->entry;
	__builtin_memcpy(e, in, sizeof(*e));
	__builtin_memcpy(e->nat_addr, s->half_key.daddr, sizeof(e->nat_addr));
	e->nat_port = s->half_key.dport;
	e->flags = (in->flags & (NS_KIND_FLAGS | CT_F_SNAT_FE)) | CT_F_SYN | CT_F_ESTABLISHED;
	e->snat_port = (in->flags & CT_F_SNAT) ? in->snat_port : 0;
	e->packets = in->packets + 1;
	e->bytes = in->bytes + len;
	e->rx_packets = 0;
	e->rx_bytes = 0;
	e->lifetime = s->claim_now + ct_timeout(cfg, p->proto, e->flags);
	e->alive_at = s->claim_now;
	__builtin_memset(&e->fib, 0, sizeof(e->fib));
	ct_tuple_set(&s->tuple, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	if (ct_est_update(&s->tuple, e, BPF_ANY))
		return 0;
	/* The ingress entry follows it, established too (its lifetime the
	 * established one once the backend answers), counting replies only
	 * from now on; ct_restore_ingress would write it back if it were
	 * gone. */
	in->packets = 0;
	in->bytes = 0;
	in->flags |= CT_F_ESTABLISHED;
	ct_move(&s->half_key, s);
	return 1;
}

/* snat_lookup_reply returns the mapping of a reply to node IP:nat port
 * (p: backend -> node IP:nat port), whose to_addr:to_port is the client,
 * or NULL when p is no such reply. The key is built in t. */
static __always_inline const struct nat_entry *snat_lookup_reply(const struct ns_pkt *p,
								 struct ct_tuple *t)
{
	ct_tuple_set(t, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     NAT_DIR_INGRESS);
	return snat_lookup_in(t);
}

/* ns_rev_dnat restores the frontend as the source of a reply from a
 * backend (p: backend -> client). It returns 1 when p belongs to a tracked
 * flow, 0 when not, < 0 on error. */
static __always_inline int ns_rev_dnat(struct __ctx_buff *ctx, struct ns_pkt *p,
				       const struct ns_config *cfg, __u32 now)
{
	struct ct_tuple t __align_stack_8;
	union lb_addr fe __align_stack_8;
	struct ct_entry *e;
	__be16 port, client_port;

	/* Egress: a local backend's every reply, and this frame has room: the
	 * key on the stack saves the scratch lookup (a helper call before 6.10). */
	e = ct_lookup_reply(p, &t);
	if (!e)
		return 0;
	/* A flow whose client port was rewritten gets it back. */
	client_port = (e->flags & CT_F_SPORT) ? e->snat_port : p->dport;
	ct_reply(ctx, cfg, p, e, ctx_len(ctx), now, &p->daddr, client_port);
	__builtin_memcpy(fe.b, e->nat_addr, sizeof(fe.b));
	port = e->nat_port;
	if (pkt_rewrite(ctx, p, false, &fe, port) ||
	    pkt_rewrite_port(ctx, p, true, client_port))
		return -1;
	return 1;
}

#endif /* __SLUICE_NAT_H */
