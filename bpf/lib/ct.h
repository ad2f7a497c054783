/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* BPF conntrack for the north-south LB.
 *
 * A translated flow has two entries in the ct map:
 *   CT_DIR_SERVICE  client -> frontend: the backend chosen for the flow,
 *                   looked up by every packet from the client;
 *   CT_DIR_INGRESS  client -> backend (after DNAT): looked up with the
 *                   reply's reversed tuple; holds the frontend the client
 *                   used (a wildcard NodePort's rev NAT entry cannot).
 * State and lifetime follow the packets seen on each entry; the agent
 * deletes dead entries (lifetime in the past), LRU eviction is the backstop.
 *
 * Tables (ns_maps.h): a flow's entries are written to ct_new, flagged
 * CT_F_NEW, and move to the established table of its protocol (ct for
 * TCP, ct_any for the rest) when the flow is established (ct_ready, then
 * ct_promote in nat.h, which moves its SNAT mappings too): TCP when the
 * client acknowledges the backend's SYN-ACK exactly, anything else when the
 * client sends in a later CT second than the one it started in, after a
 * reply. Lookups try the established table first, so an established
 * flow's packets cost one lookup; a flood of new flows churns ct_new alone.
 *
 * A TCP SYN makes the least state it can (nodeport.h): none on a DSR LB
 * node (the backend follows from the flow's hash), and elsewhere only the
 * half of the flow its backend's SYN-ACK needs: the ingress entry (with a
 * masqueraded flow's nat port in it) and its reply mapping, each in its
 * slot of ct_half and snat_half (ns_maps.h), not in ct_new and snat_new.
 * The client's ACK that acknowledges the SYN-ACK exactly makes the service
 * entry, straight into the established table (ct_complete): a spoofed SYN
 * costs one entry a flood churns, a blind ACK none.
 *
 * Closing: a FIN or RST either way closes both entries of a flow (the
 * reply side's through ct_reply_closed, the client's through
 * ct_restore_ingress). A backend that closes first holds the tuple in
 * TIME_WAIT: its flow's entries then live CT_TIME_WAIT past the close, so
 * that its nat port goes to no other client meanwhile (nat.h). A flow has
 * the 6-hour established lifetime only once its backend has sent something
 * after its SYN-ACK (CT_F_REPLY_DATA), which a DSR LB node never sees: until
 * then, the SYN timeout.
 * The clock is jiffies turned into seconds, so the lifetime changes - and
 * the entry is written - at most once a second per flow.
 */
#ifndef __SLUICE_CT_H
#define __SLUICE_CT_H

#include "l4.h"
#include "ns_maps.h"
#include "ns_events.h"

/* The CT flags that say how a flow is translated. */
#define NS_KIND_FLAGS (CT_F_LOCAL | CT_F_SNAT | CT_F_DSR | CT_F_HAIRPIN)

/* The scope of every key these programs make (ct_abi.h). */
#ifdef SLUICE_POD_LB
#define NS_CT_SCOPE CT_SCOPE_POD
#else
#define NS_CT_SCOPE CT_SCOPE_NODE
#endif


/* Cilium's defaults. */
#define CT_DEFAULT_TCP_SYN   60
#define CT_DEFAULT_TCP_EST   21600
#define CT_DEFAULT_TCP_CLOSE 10
#define CT_DEFAULT_UDP       60
#define CT_DEFAULT_HZ        250
/* How long a TCP endpoint that closes first holds the tuple: Linux's
 * TCP_TIMEWAIT_LEN. */
#define CT_TIME_WAIT         60

static __always_inline const struct ns_config *ns_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&ns_config, &zero);
}

/* The CT second last computed by this object's programs. jiffies / hz is
 * a 64-bit division, tens of cycles a packet; a packet in the same second
 * checks the kept second with a multiplication instead. Written once a
 * second, by whichever CPU first sees the next one; a single 32-bit word,
 * so a reader gets one second or the other, and checks it against its own
 * jiffies: the answer is always jiffies / hz. */
static __u32 ct_clock_sec;

/* ct_now is the CT clock in seconds. */
static __always_inline __u32 ct_now(const struct ns_config *cfg)
{
	__u32 hz = cfg->hz ? cfg->hz : CT_DEFAULT_HZ;
	__u32 sec;
	__u64 j;

	if (cfg->clock_override)
		return cfg->clock_override;
	j = bpf_jiffies64();
	sec = READ_ONCE(ct_clock_sec);
	/* Unsigned: a kept second later than j's wraps to a large value. */
	if (j - (__u64)sec * hz < hz)
		return sec;
	sec = j / hz;
	WRITE_ONCE(ct_clock_sec, sec);
	return sec;
}

static __always_inline __u32 or_default(__u32 v, __u32 def)
{
	return v ? v : def;
}

static __always_inline __u32 ct_timeout(const struct ns_config *cfg, __u8 proto,
					__u16 flags)
{
	__u32 t;

	if (proto != IPPROTO_TCP)
		return or_default(cfg->udp_timeout, CT_DEFAULT_UDP);
	if (flags & CT_F_CLOSING) {
		t = or_default(cfg->tcp_close_timeout, CT_DEFAULT_TCP_CLOSE);
		return (flags & CT_F_TW_BACKEND) && t < CT_TIME_WAIT ? CT_TIME_WAIT : t;
	}
	/* Established (an ingress entry is marked so when its flow is), and
	 * the backend answered beyond its SYN-ACK: a flow promoted on its
	 * handshake alone (or seen from a DSR LB node, where no reply passes)
	 * keeps the SYN timeout. */
	if ((flags & (CT_F_ESTABLISHED | CT_F_REPLY_DATA)) == (CT_F_ESTABLISHED | CT_F_REPLY_DATA))
		return or_default(cfg->tcp_est_timeout, CT_DEFAULT_TCP_EST);
	return or_default(cfg->tcp_syn_timeout, CT_DEFAULT_TCP_SYN);
}

/* ct_next_flags is the TCP state after a packet with tcp_flags. */
static __always_inline __u16 ct_next_flags(__u16 flags, __u8 proto, __u8 tcp_flags,
					   bool reply)
{
	if (reply)
		flags |= CT_F_SEEN_REPLY;
	if (proto != IPPROTO_TCP)
		return flags;
	if (tcp_flags & TCP_FLAG_RST)
		return flags | CT_F_CLOSING | CT_F_RST;
	if (tcp_flags & TCP_FLAG_FIN)
		return flags | CT_F_CLOSING | (reply ? CT_F_FIN_REPLY | CT_F_REPLY_DATA : 0);
	if (tcp_flags & TCP_FLAG_SYN)
		return reply ? flags : flags | CT_F_SYN;
	/* The backend answers beyond its SYN-ACK: the flow is real. */
	if (reply)
		return flags | CT_F_REPLY_DATA;
	/* The client only ACKs without SYN once the handshake is done. */
	if (!reply && (tcp_flags & TCP_FLAG_ACK))
		return flags | CT_F_ESTABLISHED;
	return flags;
}

/* ct_is_new_syn: a SYN on a closing or dead entry starts a new flow on the
 * same tuple (port reuse). */
static __always_inline bool ct_is_new_syn(const struct ct_entry *e, __u8 proto,
					  __u8 tcp_flags, __u32 now)
{
	if (e->lifetime < now)
		return true;
	return proto == IPPROTO_TCP && (e->flags & CT_F_CLOSING) &&
	       (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/* What ct_update did. */
#define CT_UPD_LIFETIME 1 /* the lifetime moved (at most once a CT second) */
#define CT_UPD_CLOSED   2 /* the entry closed (a FIN or RST) */

/* ct_update accounts one packet on e and moves its state and lifetime
 * forward. Flags and lifetime are written only when they change; it
 * returns CT_UPD_* of what changed, 0 when nothing did. */
static __always_inline int ct_update(struct ct_entry *e, const struct ns_config *cfg,
				      const struct ns_pkt *p, __u32 len, __u32 now,
				      bool reply)
{
	__u16 flags = ct_next_flags(e->flags, p->proto, p->tcp_flags, reply);
	__u32 lifetime = now + ct_timeout(cfg, p->proto, flags);
	int ret = 0;

	if (reply) {
		__sync_fetch_and_add(&e->rx_packets, 1);
		__sync_fetch_and_add(&e->rx_bytes, len);
	} else {
		__sync_fetch_and_add(&e->packets, 1);
		__sync_fetch_and_add(&e->bytes, len);
	}
	if (flags != e->flags) {
		/* A FIN or RST: the flow closes (an event when traced). */
		if ((flags & CT_F_CLOSING) && !(e->flags & CT_F_CLOSING)) {
			ret = CT_UPD_CLOSED;
			if (sl_ev_wanted(SL_EVF_CT))
				sl_ns_event(p, sl_what(SL_EV_CT_CLOSE, 0, sl_ns_mode(flags, false),
						       SL_HOOK_THIS),
					    sl_rev_len(e->rev_nat_id, len), e->backend_id, 0);
		}
		WRITE_ONCE(e->flags, flags);
	}
	if (lifetime == e->lifetime)
		return ret;
	WRITE_ONCE(e->lifetime, lifetime);
	return ret | CT_UPD_LIFETIME;
}

static __always_inline void ct_tuple_set(struct ct_tuple *t, const union lb_addr *saddr,
					 const union lb_addr *daddr, __be16 sport,
					 __be16 dport, __u8 proto, __u8 dir)
{
	__builtin_memcpy(t->saddr, saddr->b, sizeof(t->saddr));
	__builtin_memcpy(t->daddr, daddr->b, sizeof(t->daddr));
	t->sport = sport;
	t->dport = dport;
	t->proto = proto;
	t->dir = dir;
	t->scope = NS_CT_SCOPE;
	t->pad = 0;
}

/* ct_client_port is the client port that the backend of the flow whose
 * service entry is svc knows it by (before any SNAT): the client's own
 * sport, or the one given to it when another flow held its tuple after
 * DNAT (CT_F_SPORT). */
static __always_inline __be16 ct_client_port(const struct ct_entry *svc, __be16 sport)
{
	return (svc->flags & CT_F_SPORT) ? svc->snat_port : sport;
}

/* ct_snat_copy is the copy of a masqueraded flow's nat port that its
 * service entry svc holds, 0 when none: a flow given another client port
 * (CT_F_SPORT) keeps that port in its place, and its nat port only in its
 * mapping (whose key has the port given). */
static __always_inline __be16 ct_snat_copy(const struct ct_entry *svc)
{
	return (svc->flags & CT_F_SPORT) ? 0 : svc->snat_port;
}

/* ct_ingress_tuple is the key of the ingress entry of flow p (before DNAT)
 * whose service entry is svc. A hairpin flow reaches the backend from the
 * frontend's address: its replies go there; a flow whose client port is
 * rewritten (CT_F_SPORT) from that port. */
static __always_inline void ct_ingress_tuple(struct ct_tuple *t, const struct ns_pkt *p,
					     const struct ct_entry *svc)
{
	ct_tuple_set(t, (svc->flags & CT_F_HAIRPIN) ? &p->daddr : &p->saddr,
		     (const union lb_addr *)svc->nat_addr, ct_client_port(svc, p->sport),
		     svc->nat_port, p->proto, CT_DIR_INGRESS);
}

/* Client ports tried for a flow whose tuple after DNAT another flow holds. */
#define CT_SPORT_TRIES 8

/* ct_ingress_of: the ingress entry in, under the tuple after DNAT of flow
 * p, is p's own: it restores p's frontend and client port. Another flow's
 * is one to another frontend of the backend, or one whose client port was
 * rewritten to p's. */
static __always_inline bool ct_ingress_of(const struct ct_entry *in, const struct ns_pkt *p)
{
	if (in->nat_port != p->dport || !addr_equal(&p->daddr, in->nat_addr))
		return false;
	return !(in->flags & CT_F_SPORT) || in->snat_port == p->sport;
}

/* ct_ingress_clash: the ingress entry in, under the tuple after DNAT of the
 * new flow p, is another flow's that still lives. A dead or closing TCP
 * one gives way (its flow ended: the client reuses the port). */
static __always_inline bool ct_ingress_clash(const struct ct_entry *in, const struct ns_pkt *p,
					     __u32 now)
{
	if (!in || in->lifetime < now ||
	    (p->proto == IPPROTO_TCP && (in->flags & CT_F_CLOSING)))
		return false;
	return !ct_ingress_of(in, p);
}

/* ct_clash_sport gives the new flow p to a local backend or a masqueraded
 * one (CT_F_SNAT: its mapping's key then has the port given), whose service
 * entry is being made in the scratch (s->entry), another client port when
 * another live flow holds its tuple after DNAT (ct_ingress_clash), as
 * netfilter's implicit source NAT does: a port of 1024-65535 that no
 * ingress entry to that backend has, in the entry (CT_F_SPORT, snat_port)
 * and in s->sport. None is given when there is no clash, or no free port
 * turned up in CT_SPORT_TRIES random tries: the new flow then takes the
 * tuple over. A global function, verified once, called beside ct_put_flow
 * (not from it: their frames would add up). */
__noinline int ct_clash_sport(const struct ns_pkt *p, __u32 now)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *in;
	struct ct_tuple *t;
	__u32 h;
	int i;

	if (!s || !p)
		return 0;
	t = &s->tuple;
	s->half_idx = -1;
	s->in_half = 0;

	ct_tuple_set(t, &p->saddr, (const union lb_addr *)s->entry.nat_addr, p->sport,
		     s->entry.nat_port, p->proto, CT_DIR_INGRESS);
	h = half_hash(t);
	in = ct_est_lookup_h(t, h);
	s->in_est = !!in;
	s->in_seen = !!in;
	s->in_new = 0;
	if (!ct_ingress_clash(in, p, now)) {
		i = half_slot_h(t, 0, h);
		s->half_idx = half_unheld(i);
		s->in_half = i >= 0;
		in = i >= 0 ? ct_half_entry(i) : NULL; /* half_slot checked the key */
		if (!in) {
			in = ct_new_lookup_h(t, h);
			s->in_new = !!in;
		}
		s->in_seen |= !!in;
		if (!ct_ingress_clash(in, p, now))
			return 0;
	}
	for (i = 0; i < CT_SPORT_TRIES; i++) {
		t->sport = bpf_htons(1024 + bpf_get_prandom_u32() % (65536 - 1024));
		if (ct_est_lookup(t) || ct_new_lookup(t))
			continue;
		s->entry.flags |= CT_F_SPORT;
		s->entry.snat_port = t->sport;
		s->sport = t->sport;
		s->in_est = 0; /* the tuple given is in neither table */
		return 0;
	}
	return 0;
}

/* ct_put writes e under key t into its table: ct_new for a new flow's,
 * its slot of ct_half for a half-open flow's ingress entry (half), over
 * whatever is there (uflags BPF_ANY; half_idx its slot, from
 * ct_clash_sport, < 0: unknown); an entry of t in ct_new then goes
 * (in_new, from ct_clash_sport), which the slot's being overwritten would
 * bring back to lookups. Written elsewhere, an ingress entry of t in its
 * slot goes (in_half: the slot holds t, from ct_clash_sport; 1 unknown):
 * lookups read the slot first, and an earlier flow's entry there (a dead
 * half-open one of the same client port) would hide this one's. */
static __always_inline int ct_put(const struct ct_tuple *t, const struct ct_entry *e,
				  __u64 uflags, bool half, bool in_new, int half_idx, bool in_half)
{
	if (half && !ct_half_put(t, e, half_idx)) {
		if (in_new)
			bpf_map_delete_elem(&ct_new, t);
		return 0;
	}
	if (in_half && t->proto == IPPROTO_TCP)
		ct_half_delete(t);
	if (e->flags & CT_F_NEW)
		return ct_new_update(t, e, uflags);
	return ct_est_update(t, e, uflags);
}

/* ct_promote takes the client's ack as acknowledging the backend's SYN-ACK
 * only when it is exactly the one the SYN-ACK asks for (its sequence + 1),
 * as the handshake's ACK always is: a sender that spoofs its address never
 * sees the SYN-ACK and guesses it 1 time in 2^32. */

/* ct_has_ingress: the flow's translation has an ingress entry to keep
 * (not DSR seen from the LB node, whose replies bypass it). */
static __always_inline bool ct_has_ingress(const struct ct_entry *svc)
{
	return (svc->flags & (CT_F_DSR | CT_F_LOCAL)) != CT_F_DSR;
}

/* ct_note_syn_ack records in the ingress entry e of a new TCP flow the ack
 * its backend's SYN-ACK p asks of the client (TCP sequence + 1), for
 * ct_promote: the flow moves to the established table only once the
 * client acknowledged it, which nf_conntrack's window check also demands. */
static __always_inline void ct_note_syn_ack(struct __ctx_buff *ctx, const struct ns_pkt *p,
					    struct ct_entry *e)
{
	__be32 seq;
	__u32 ack;

	if (p->proto != IPPROTO_TCP || !(e->flags & CT_F_NEW) ||
	    (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != (TCP_FLAG_SYN | TCP_FLAG_ACK))
		return;
	if (ctx_load_bytes(ctx, p->l4_off + 4, &seq, sizeof(seq)))
		return;
	ack = bpf_ntohl(seq) + 1;
	/* A SYN-ACK of another sequence (SYN cookies answer each SYN the
	 * client sends again anew): the client acknowledges whichever it got,
	 * so the one before is kept too. */
	if (e->alive_at && e->alive_at != ack)
		WRITE_ONCE(e->ack_prev, e->alive_at);
	WRITE_ONCE(e->alive_at, ack);
}

/* ct_acks_syn_ack: ack (host order) acknowledges a SYN-ACK the ingress
 * entry in of a new TCP flow saw, exactly. */
static __always_inline bool ct_acks_syn_ack(const struct ct_entry *in, __u32 ack)
{
	return in->alive_at && (ack == in->alive_at || (in->ack_prev && ack == in->ack_prev));
}

/* ct_ready: the new flow of service entry e (CT_F_NEW) may be
 * established, after the client's packet at CT second now was accounted
 * (ct_update): TCP once the client ACKs without SYN after its SYN, and is
 * not closing (a flow picked up mid-stream, without a SYN, at its third
 * packet); anything else once the client sends in a later second than the
 * first. ct_promote also wants the backend's reply seen, where replies
 * cross this node: a blind sender's packets earn none (or a RST). Where
 * they do not (DSR seen from the LB node), TCP waits for a third packet. */
static __always_inline bool ct_ready(const struct ct_entry *e, __u8 proto, __u32 now)
{
	if (!(e->flags & CT_F_NEW))
		return false;
	/* A DSR LB node sees no reply, so nothing it sees tells a real
	 * client from a blind one: its flows stay in ct_new, which floods
	 * churn, and their packets follow the flow's hash when their entry
	 * is gone (nodeport.h). */
	if (!ct_has_ingress(e))
		return false;
	if (proto == IPPROTO_TCP)
		return (e->flags & (CT_F_ESTABLISHED | CT_F_CLOSING)) == CT_F_ESTABLISHED &&
		       e->packets > ((e->flags & CT_F_SYN) ? 1 : 2);
	return now != e->created;
}

/* ct_write_ingress writes the ingress entry of flow p (before DNAT) under
 * the key in s->tuple (ct_ingress_tuple) from its service entry, held in
 * s->entry (which it turns into the ingress entry, in the service entry's
 * table), with the update flags uflags. The ingress entry counts replies
 * only (rx_*), but a half-open flow's (half) keeps its SYN's in packets and
 * bytes, for its service entry (ct_complete), and goes to its slot (ct_put). */
static __always_inline int ct_write_ingress(struct ct_scratch *s, const struct ns_pkt *p,
					    __u64 uflags, bool half)
{
	struct ct_entry *e = &s->entry;

	if (!half) {
		e->packets = 0;
		e->bytes = 0;
	}
	e->rx_packets = 0;
	e->rx_bytes = 0;
	e->alive_at = 0;
	e->ack_prev = 0;
	/* The service entry's FIB result is for the other direction. */
	__builtin_memset(&e->fib, 0, sizeof(e->fib));
	__builtin_memcpy(e->nat_addr, p->daddr.b, sizeof(e->nat_addr));
	e->nat_port = p->dport;
	if (e->flags & CT_F_SPORT)
		e->snat_port = p->sport;
	return ct_put(&s->tuple, e, uflags, half, s->in_new, s->half_idx, s->in_half);
}

/* ct_put_flow writes the entries of the new flow p whose service entry
 * ct_create_flow made in the scratch (s->entry) into ct_new, with the
 * ingress entry unless its kind (CT_F_*) has none. half: a TCP SYN, whose
 * flow needs only its ingress entry until the client's ACK (ct_complete);
 * a SYN given another client port (CT_F_SPORT) keeps its service entry, the
 * only place that port is kept. s->half then says which was written. A
 * global function, verified once: one call instead of the map updates
 * inlined into the service path, whose stack 6.1's limit holds to 512
 * bytes. */
__noinline int ct_put_flow(const struct ns_pkt *p, __u32 kind, __u32 half)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_tuple *t;
	struct ct_entry *e;
	int err;

	if (!s || !p)
		return -1;
	t = &s->tuple;
	e = &s->entry;
	ct_tuple_set(t, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	__builtin_memcpy(&s->svc_key, t, sizeof(s->svc_key));
	s->half = half && !(e->flags & CT_F_SPORT);
	if (!s->half) {
		err = ct_new_update(t, e, BPF_ANY);
		/* DSR on the LB node: replies bypass it. */
		if (err || (kind & (CT_F_DSR | CT_F_LOCAL)) == CT_F_DSR)
			return err;
	}

	ct_ingress_tuple(t, p, e);
	__builtin_memcpy(&s->half_key, t, sizeof(s->half_key));
	/* An earlier flow's entry that gives way (dead, closing, this
	 * flow's own, or any when no other client port was free:
	 * docs/semantics.md) leaves the established table, which lookups
	 * read first: its replies would leave from its frontend. */
	if (s->in_est)
		ct_est_delete(t);
	/* A half-open flow's ingress entry keeps the SYN's counts, the
	 * client's, for the service entry ct_complete makes. */
	return ct_write_ingress(s, p, BPF_ANY, s->half);
}

/* ct_create_flow writes the entries of a new translated flow into ct_new:
 * the service entry for the client's tuple (p, before DNAT) and the
 * ingress entry for the tuple after DNAT to be_addr:be_port; with half (a
 * TCP SYN), the ingress entry alone when it can (ct_put_flow). kind is
 * CT_F_LOCAL, CT_F_SNAT or CT_F_DSR (with CT_F_LOCAL on the backend
 * node). The scratch's sport is then the client port the backend is to
 * see when it is not p's (CT_F_SPORT), else 0. */
static __always_inline int ct_create_flow(const struct ns_config *cfg,
					  const struct ns_pkt *p, __u32 len, __u32 now,
					  const union lb_addr *be_addr, __be16 be_port,
					  __u32 backend_id, __u16 rev_nat_id, __u16 kind, bool half)
{
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *e;

	if (!s)
		return -1;
	e = &s->entry;
	__builtin_memset(e, 0, sizeof(*e));
	e->nat_port = be_port;
	e->rev_nat_id = rev_nat_id;
	e->created = now;
	e->alive_at = now; /* backend and frontend were just read */
	e->backend_id = backend_id;
	e->packets = 1;
	e->bytes = len;
	e->flags = ct_next_flags(kind, p->proto, p->tcp_flags, false) | CT_F_NEW;
	e->lifetime = now + ct_timeout(cfg, p->proto, e->flags);
	__builtin_memcpy(e->nat_addr, be_addr->b, sizeof(e->nat_addr));
	/* Another live flow of the client's address and port to another
	 * frontend of this backend (a NodePort and a LoadBalancer IP, say)
	 * holds the tuple after DNAT: replies could not tell the two apart
	 * (a masqueraded one's would share one mapping). This one gets
	 * another client port, as netfilter's implicit source NAT gives. */
	s->sport = 0;
	s->in_est = 1; /* unknown: ct_put_flow looks */
	s->in_seen = 1; /* unknown: snat_egress looks */
	s->in_new = 1; /* unknown: ct_put deletes */
	s->half_idx = -1; /* unknown: ct_put hashes */
	s->in_half = 1; /* unknown: ct_put empties the slot */
	if ((kind & (CT_F_LOCAL | CT_F_HAIRPIN)) == CT_F_LOCAL || kind == CT_F_SNAT)
		ct_clash_sport(p, now);
	return ct_put_flow(p, kind, half);
}

/* ct_restore_ingress keeps the ingress entry of the established flow p
 * (before DNAT) in step with its service entry svc. It writes it back when
 * it is gone: LRU eviction picks entries one by one, and a flow whose
 * service entry survives while its ingress entry does not would have its
 * replies go out untranslated. It moves its lifetime up to the service
 * entry's: a flow that only sends (no replies) would otherwise lose the
 * ingress entry, and with it, to the agent's GC, its SNAT port. A client's
 * FIN or RST closes it too (its lifetime then follows the service entry's
 * down, past a backend's TIME_WAIT), and what the backend sent beyond its
 * SYN-ACK (CT_F_REPLY_DATA) gives the service entry the established
 * lifetime. Called when the service entry's lifetime moves, so at most
 * once a CT second per flow (and at a close); the lookup also keeps the
 * ingress entry recently used. */
/* ct_retire_one moves the entry under key t from the established table to
 * ct_new, as a new flow's (CT_F_NEW), staged in s->entry: 0 when moved. */
static __always_inline int ct_retire_one(const struct ct_tuple *t, struct ct_scratch *s)
{
	struct ct_entry *e = ct_est_lookup(t);

	if (!e)
		return -1;
	__builtin_memcpy(&s->entry, e, sizeof(s->entry));
	s->entry.flags |= CT_F_NEW;
	if (ct_new_update(t, &s->entry, BPF_ANY))
		return -1;
	ct_est_delete(t);
	return 0;
}

/* snat_retire_one moves the mapping under key t from the established
 * table to snat_new, leaving a copy in s->nat: 0 when moved. */
static __always_inline int snat_retire_one(const struct ct_tuple *t, struct ct_scratch *s)
{
	struct nat_entry *n = snat_est_lookup(t);

	if (!n)
		return -1;
	__builtin_memcpy(&s->nat, n, sizeof(s->nat));
	if (snat_new_update(t, &s->nat, BPF_ANY))
		return -1;
	snat_est_delete(t);
	return 0;
}

/* ct_retire moves a TCP flow that both sides closed (each its FIN, or a
 * RST) out of the established tables into the new flows' (ct_new,
 * snat_new): its service entry (key in the scratch's retire_svc), its
 * ingress entry (retire_in) and a masqueraded flow's mappings. A closed
 * flow lingers there for its close timeout (a backend's TIME_WAIT) until
 * the agent's GC, and in one table with the live ones an LRU evicts by
 * age alone: a client cycling short connections (2,000 a second, 160,000
 * entries in 40 s) evicted the idle live connections of the same table,
 * whose next packets then found no state. In ct_new the closed flows churn
 * with the new ones; their packets still translate (a last ACK, a FIN sent
 * again). A global function, verified once: once a flow. */
__noinline int ct_retire(__u32 proto)
{
	struct ct_scratch *s = ns_scratch();
	__be16 cport;

	if (!s || proto != IPPROTO_TCP)
		return 0;
	if (ct_retire_one(&s->retire_svc, s))
		return 0;
	cport = ct_client_port(&s->entry, s->retire_svc.sport);
	ct_retire_one(&s->retire_in, s);
	if (!(s->entry.flags & CT_F_SNAT))
		return 0;
	/* The egress mapping (client -> backend), then the ingress one. */
	ct_tuple_set(&s->tuple3, (const union lb_addr *)s->retire_svc.saddr,
		     (const union lb_addr *)s->retire_in.daddr, cport, s->retire_in.dport,
		     IPPROTO_TCP, NAT_DIR_EGRESS);
	if (snat_retire_one(&s->tuple3, s))
		return 0;
	ct_tuple_set(&s->tuple3, (const union lb_addr *)s->retire_in.daddr,
		     (const union lb_addr *)s->nat.to_addr, s->retire_in.dport, s->nat.to_port,
		     IPPROTO_TCP, NAT_DIR_INGRESS);
	snat_retire_one(&s->tuple3, s);
	return 0;
}

__noinline int ct_restore_ingress(const struct ns_config *cfg, const struct ns_pkt *p,
				  struct ct_entry *svc, __u32 now)
{
	/* The scratch from its map, not an argument: 6.1's verifier takes a
	 * map value as a key, not a global function's memory argument. */
	struct ct_scratch *s = ns_scratch();
	struct ct_entry *in;
	__u32 lifetime;
	__u16 flags;

	if (!cfg || !p || !svc || !s || !ct_has_ingress(svc))
		return 0;
	ct_ingress_tuple(&s->tuple, p, svc);
	in = ct_lookup_in(&s->tuple);
	if (!in) {
		__builtin_memcpy(&s->entry, svc, sizeof(s->entry));
		s->in_half = 0; /* ct_lookup_in looked */
		ct_write_ingress(s, p, BPF_NOEXIST, false);
		return 0;
	}
	if ((in->flags & CT_F_REPLY_DATA) && !(svc->flags & CT_F_REPLY_DATA)) {
		flags = svc->flags | CT_F_REPLY_DATA;
		WRITE_ONCE(svc->flags, flags);
		lifetime = now + ct_timeout(cfg, p->proto, flags);
		if (lifetime > svc->lifetime)
			WRITE_ONCE(svc->lifetime, lifetime);
	}
	lifetime = svc->lifetime;
	if (svc->flags & CT_F_CLOSING) {
		flags = in->flags | CT_F_CLOSING | (svc->flags & CT_F_RST);
		if (flags != in->flags)
			WRITE_ONCE(in->flags, flags);
		/* The backend's TIME_WAIT outlasts the client's close. */
		if (!(flags & CT_F_TW_BACKEND) || in->lifetime <= lifetime)
			WRITE_ONCE(in->lifetime, lifetime);
		/* Both sides done, and still in the established tables. */
		if (p->proto == IPPROTO_TCP && (flags & (CT_F_RST | CT_F_FIN_REPLY)) &&
		    !(svc->flags & CT_F_NEW)) {
			ct_tuple_set(&s->retire_svc, &p->saddr, &p->daddr, p->sport, p->dport,
				     p->proto, CT_DIR_SERVICE);
			__builtin_memcpy(&s->retire_in, &s->tuple, sizeof(s->retire_in));
			ct_retire(p->proto);
		}
		return 0;
	}
	if (in->lifetime < lifetime)
		WRITE_ONCE(in->lifetime, lifetime);
	return 0;
}

/* ct_reply_closed closes the service entry of the flow whose reply p (a
 * FIN or a RST from its backend) just closed its ingress entry in (or,
 * the ingress entry still open, gives it the backend's first answer past
 * its SYN-ACK, CT_F_REPLY_DATA, and with it the established lifetime): the
 * flow is over either way (a client that goes silent after its backend's
 * RST would otherwise keep the service entry for the established
 * lifetime). client:client_port is the client as it sent (before any
 * rewrite of its port). A FIN before the client's is a backend that closes
 * first and holds the tuple in TIME_WAIT: the ingress entry, which keeps
 * the flow's nat port, lives that long (CT_F_TW_BACKEND). A global
 * function, verified once: a close is rare. */
__noinline int ct_reply_closed(const struct ns_pkt *p, struct ct_entry *in, __u32 now)
{
	struct ct_scratch *s = ns_scratch();
	const struct ns_config *cfg = ns_cfg();
	struct ct_entry *svc;
	__u32 lifetime;
	__u16 flags;
	bool done;

	if (!s || !cfg || !p || !in)
		return 0;
	/* The client, as ct_reply left it in tuple3. */
	ct_tuple_set(&s->tuple2, (const union lb_addr *)s->tuple3.saddr,
		     (const union lb_addr *)in->nat_addr, s->tuple3.sport, in->nat_port, p->proto,
		     CT_DIR_SERVICE);
	svc = ct_lookup(&s->tuple2);
	/* Its own: the backend it names is the reply's. */
	if (svc && (svc->nat_port != p->sport || !addr_equal(&p->saddr, svc->nat_addr)))
		svc = NULL;
	if (!(in->flags & CT_F_CLOSING)) {
		/* The backend's first answer: the flow is real. */
		if (!svc || (svc->flags & CT_F_REPLY_DATA))
			return 0;
		flags = svc->flags | CT_F_REPLY_DATA;
		WRITE_ONCE(svc->flags, flags);
		lifetime = now + ct_timeout(cfg, p->proto, flags);
		if (lifetime > svc->lifetime)
			WRITE_ONCE(svc->lifetime, lifetime);
		return 0;
	}
	flags = in->flags;
	if (!(flags & CT_F_RST) && !(svc && (svc->flags & CT_F_CLOSING)) &&
	    !(flags & CT_F_TW_BACKEND)) {
		flags |= CT_F_TW_BACKEND;
		WRITE_ONCE(in->flags, flags);
		WRITE_ONCE(in->lifetime, now + ct_timeout(cfg, p->proto, flags));
	}
	if (!svc)
		return 0;
	/* The client had closed too (or either side reset): both sides are
	 * done, the flow leaves the established tables (ct_retire). */
	done = (svc->flags & CT_F_CLOSING) || (in->flags & CT_F_RST);
	flags = svc->flags | CT_F_CLOSING | (in->flags & (CT_F_RST | CT_F_TW_BACKEND));
	if (flags != svc->flags)
		WRITE_ONCE(svc->flags, flags);
	WRITE_ONCE(svc->lifetime, now + ct_timeout(cfg, p->proto, flags));
	if (!done || (flags & (CT_F_NEW | CT_F_HAIRPIN)))
		return 0;
	__builtin_memcpy(&s->retire_svc, &s->tuple2, sizeof(s->retire_svc));
	ct_tuple_set(&s->retire_in, (const union lb_addr *)s->tuple3.saddr, &p->saddr,
		     ct_client_port(svc, s->tuple3.sport), p->sport, p->proto, CT_DIR_INGRESS);
	ct_retire(p->proto);
	return 0;
}

/* ct_reply_done finishes a reply p (backend -> client) that ct_reply
 * accounted on its flow's ingress entry e, whose flags were had (the high
 * half of arg; the low half: the client's own port): a new flow's SYN-ACK
 * (ct_note_syn_ack); a close, which closes the service entry too; or the
 * backend's first answer past its SYN-ACK, which gives the service entry
 * the established lifetime at once (both ct_reply_closed): a client whose
 * next packet comes in the same CT second (the ACK of the answer), then
 * none for a while (an idle pool), would otherwise keep the SYN timeout.
 * A global function, verified once, with no event of its own below it: its
 * frame and ct_reply_closed's stay within 6.1's stack beside the service
 * path's. */
__noinline int ct_reply_done(struct __ctx_buff *ctx, const struct ns_pkt *p, struct ct_entry *e,
			     const union lb_addr *client, __u32 arg)
{
	const struct ns_config *cfg;
	struct ct_scratch *s;
	__u16 had = arg >> 16;

	if (!p || !e || !client)
		return 0;
	ct_note_syn_ack(ctx, p, e);
	if (p->proto != IPPROTO_TCP ||
	    !(((e->flags & ~had) & (CT_F_CLOSING | CT_F_REPLY_DATA))))
		return 0;
	s = ns_scratch();
	cfg = ns_cfg();
	if (!s || !cfg)
		return 0;
	/* The client, for ct_reply_closed: in the scratch, not this frame. */
	__builtin_memcpy(s->tuple3.saddr, client->b, sizeof(s->tuple3.saddr));
	s->tuple3.sport = (__be16)arg;
	ct_reply_closed(p, e, ct_now(cfg));
	return 0;
}

/* ct_reply accounts a reply p (backend -> client) on its flow's ingress
 * entry e: its state and lifetime (ct_update), then what follows from it
 * (ct_reply_done; client:client_port is the client as it sent). */
static __always_inline void ct_reply(struct __ctx_buff *ctx, const struct ns_config *cfg,
				     struct ns_pkt *p, struct ct_entry *e, __u32 len, __u32 now,
				     const union lb_addr *client, __be16 client_port)
{
	__u32 had = e->flags;

	ct_update(e, cfg, p, len, now, true);
	ct_reply_done(ctx, p, e, client, (had << 16) | (__u16)client_port);
}

/* ct_delete_flow deletes the entries in ct of the flow of p (before DNAT)
 * whose service entry e is: an earlier flow on the tuple that a new one
 * replaces. Its ingress entry only while it is still its own: a dead
 * flow's tuple after DNAT may have gone to a live flow to another
 * frontend since (ct_put_flow), whose replies need it. A global function,
 * verified once, off the hot path. */
__noinline int ct_delete_flow(const struct ns_pkt *p, const struct ct_entry *e)
{
	struct ct_scratch *s = ns_scratch();
	const struct ct_entry *in;

	if (!s || !p || !e)
		return 0;
	if (ct_has_ingress(e)) {
		ct_ingress_tuple(&s->tuple2, p, e);
		in = ct_est_lookup(&s->tuple2);
		if (in && ct_ingress_of(in, p))
			ct_est_delete(&s->tuple2);
	}
	ct_tuple_set(&s->tuple2, &p->saddr, &p->daddr, p->sport, p->dport, p->proto,
		     CT_DIR_SERVICE);
	ct_est_delete(&s->tuple2);
	return 0;
}

/* ct_lookup_reply_to finds the ingress entry of a reply from a backend to
 * client:port (p is backend -> client, or -> the nat port that stands for
 * it), with the key built in t (the stack, or the per-CPU scratch). */
static __always_inline struct ct_entry *ct_lookup_reply_to(const struct ns_pkt *p,
							   const union lb_addr *client,
							   __be16 port, struct ct_tuple *t)
{
	ct_tuple_set(t, client, &p->saddr, port, p->sport, p->proto, CT_DIR_INGRESS);
	return ct_lookup_in(t);
}

/* ct_lookup_reply finds the ingress entry of a reply from a backend (p is
 * backend -> client). */
static __always_inline struct ct_entry *ct_lookup_reply(const struct ns_pkt *p,
							struct ct_tuple *t)
{
	return ct_lookup_reply_to(p, &p->daddr, p->dport, t);
}

#endif /* __SLUICE_CT_H */
