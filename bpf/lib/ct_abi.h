/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The north-south map ABI: conntrack, SNAT and the tc/XDP configuration.
 *
 * Same conventions as lb_abi.h: addresses are 16 bytes (IPv4 v4-mapped),
 * ports network order, everything else host order. One conntrack map and
 * one NAT map serve both families, like the LB maps, so the agent dumps and
 * collects one table each. Times are CT clock seconds: bpf_jiffies64() /
 * hz, read back by the agent through the tc_ct_clock program.
 *
 * Go mirrors these structs in internal/lbmap (ct.go, nat.go).
 */
#ifndef __SLUICE_CT_ABI_H
#define __SLUICE_CT_ABI_H

#include <linux/types.h>

/* ct_tuple.dir: what the key describes. */
#define CT_DIR_SERVICE 0 /* client -> frontend, before DNAT: picks the backend */
#define CT_DIR_INGRESS 1 /* client -> backend, after DNAT: replies find the frontend */
#define NAT_DIR_EGRESS  2 /* client -> backend, before SNAT: gives node IP and port */
#define NAT_DIR_INGRESS 3 /* backend -> node IP:port, a reply: gives the client */

/* ct_tuple.scope: the programs whose flows the key names. One map serves
 * the node's programs (tc and XDP on its devices: flows from the wire) and
 * the pods' (tc_pod.c, --socket-lb=false: flows from local pods), so a
 * flow of one is never looked up by the other: a pod that sends with an
 * outside client's address and port does not ride that client's
 * (masqueraded) flow, nor does a packet from the wire with a pod's tuple
 * ride the pod's. */
#define CT_SCOPE_NODE 0
#define CT_SCOPE_POD  1

/* ct_entry.flags */
#define CT_F_SYN         (1 << 0) /* TCP SYN seen in the key's direction */
#define CT_F_ESTABLISHED (1 << 1) /* TCP: handshake completed (ACK without SYN) */
#define CT_F_CLOSING     (1 << 2) /* TCP FIN or RST seen */
#define CT_F_SEEN_REPLY  (1 << 3) /* a reply went through */
#define CT_F_LOCAL       (1 << 4) /* backend on this node: DNAT only */
#define CT_F_SNAT        (1 << 5) /* remote backend reached through SNAT */
#define CT_F_DSR         (1 << 6) /* remote backend reached through DSR */
#define CT_F_HAIRPIN     (1 << 7) /* per-packet LB: a pod to its own Service, its
				   * source rewritten to the frontend */
#define CT_F_SNAT_FE     (1 << 8) /* snat_port's source address is the frontend (a
				   * node IP), not ns_config's snat_addr */
#define CT_F_NEW         (1 << 9) /* a new flow's, in ct_new (ct.h): not yet
				   * established; cleared when it moves to ct */
#define CT_F_SPORT       (1 << 10) /* CT_F_LOCAL (not hairpin) or CT_F_SNAT:
				    * the client's port is rewritten (before
				    * any SNAT), as another flow of the
				    * client's address and port to another
				    * frontend holds the tuple after DNAT
				    * (ct.h). snat_port is then the port the
				    * backend sees in the SERVICE entry, the
				    * client's own in the INGRESS entry (whose
				    * key has the port the backend sees); a
				    * CT_F_SNAT flow keeps no copy of its nat
				    * port then (ct_snat_copy) */
#define CT_F_RST         (1 << 11) /* TCP: closed by a RST (either way): no
				    * TIME_WAIT on either side */
#define CT_F_FIN_REPLY   (1 << 12) /* TCP: the backend sent its FIN */
#define CT_F_TW_BACKEND  (1 << 13) /* TCP: the backend closed first, so it
				    * holds the tuple in TIME_WAIT: the entry
				    * lives CT_TIME_WAIT seconds past the
				    * close, and its nat port is not given to
				    * another client before (ct.h) */
#define CT_F_REPLY_DATA  (1 << 14) /* TCP: the backend sent something after
				    * its SYN-ACK (not a RST): the flow earns
				    * the established lifetime (ct.h) */

/* ns_config.mode, --lb-mode. */
#define NS_MODE_SNAT   0
#define NS_MODE_DSR    1
#define NS_MODE_HYBRID 2 /* DSR for TCP, SNAT for UDP */

/* Key of the ct and snat maps: a 5-tuple and what it describes. */
struct ct_tuple {
	__u8   saddr[16];
	__u8   daddr[16];
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   dir;   /* CT_DIR_* or NAT_DIR_* */
	__u8   scope; /* CT_SCOPE_*: whose programs made the entry */
	__u8   pad;
} __attribute__((aligned(4))); /* the layout of its fields: addresses copied
				  * in words, not half-words */

/* A FIB result kept in a CT entry, so that a flow's later packets in the
 * same CT second skip bpf_fib_lookup. Only what the XDP and tc forwarding
 * uses: the device and, for XDP, the MACs. */
struct ct_fib {
	__u32 ifindex;       /* egress device; 0: nothing kept */
	__u8  dmac[6];
	__u8  smac[6];
	__u16 max_len;       /* the L3 length the FIB passed (its MTU check):
			      * a longer packet looks up again */
	__u16 pad;
	__u32 at;            /* CT clock second of the lookup */
};

struct ct_entry {
	__u8   nat_addr[16]; /* SERVICE: the backend; INGRESS: the frontend to restore */
	__be16 nat_port;
	__u16  rev_nat_id;   /* lb_rev_nat index of the service */
	__u16  flags;        /* CT_F_* */
	__be16 snat_port;    /* SERVICE, CT_F_SNAT: the flow's nat port, a copy of
			      * its egress mapping (0: not known); CT_F_SPORT,
			      * instead: the client port the backend sees
			      * (SERVICE) or the client's own (INGRESS) */
	__u64  packets;      /* in the key's direction */
	__u64  bytes;
	__u64  rx_packets;   /* replies (CT_DIR_INGRESS entries) */
	__u64  rx_bytes;
	__u32  lifetime;     /* CT clock second after which the entry is dead */
	__u32  created;      /* CT clock second */
	__u32  backend_id;   /* the selected backend */
	__u32  alive_at;     /* SERVICE: CT clock second its frontend and backend
			      * were last found installed; INGRESS of a new TCP
			      * flow: the ack its backend's SYN-ACK asks of the
			      * client (sequence + 1, host order; 0: none seen) */
	struct ct_fib fib;   /* the FIB result of the flow's forwarding, this
			      * entry's direction */
	__u32  ack_prev;     /* INGRESS of a new TCP flow: the ack an earlier
			      * SYN-ACK of another sequence asked of the client
			      * (a backend answering a SYN sent again with a new
			      * SYN cookie), 0: none */
	__u32  completing;   /* INGRESS of a half-open TCP flow: nonzero once a
			      * CPU took its completion (ct_complete, whose
			      * compare and swap is of the 64-bit word with
			      * ack_prev: -mcpu=v1 has no 32-bit one) */
};

/* ct_ack_word is the 64-bit word of e's ack_prev and completing, the
 * latter its high half (bpfel). */
#define ct_ack_word(e) ((__u64 *)&(e)->ack_prev)
_Static_assert(__builtin_offsetof(struct ct_entry, ack_prev) % 8 == 0 &&
		       __builtin_offsetof(struct ct_entry, completing) ==
			       __builtin_offsetof(struct ct_entry, ack_prev) + 4,
	       "ct_entry: ack_prev and completing, an aligned word for a 64-bit compare and swap");

struct nat_entry {
	__u8   to_addr[16]; /* EGRESS: node IP; INGRESS: the client */
	__be16 to_port;
	__u16  flags;       /* SNAT_F_* */
	__u32  created;     /* CT clock second: made, or taken back by its
			     * client (SNAT_F_REUSED); SNAT_TAKING while a
			     * CPU takes the port over */
} __attribute__((aligned(8))); /* nat_word: a 64-bit compare and swap */

/* An ingress mapping that a new flow of its own client took back (a SYN on
 * the tuple of a flow that is over, snat_hold) at its created second: the
 * conntrack entries under its tuple may still be the last flow's for a
 * moment, and say nothing of whether the port is free. */
#define SNAT_F_REUSED 1
/* created while a CPU takes the port over (snat_claim): a CT second the
 * clock never reaches. */
#define SNAT_TAKING 0xffffffffU

/* nat_word is the 64-bit word of n's to_port, flags and created (bpfel:
 * created the high half), for one compare and swap of the three. */
#define nat_word(n) ((__u64 *)&(n)->to_port)
#define nat_word_created(w) ((__u32)((w) >> 32))
#define nat_word_flags(w) ((__u16)((w) >> 16))
/* nat_word_with is the word w with flags and created replaced. */
#define nat_word_with(w, flags, created)                                                    \
	(((w) & 0xffffULL) | ((__u64)(__u16)(flags) << 16) | ((__u64)(__u32)(created) << 32))
_Static_assert(__builtin_offsetof(struct nat_entry, to_port) % 8 == 0 &&
		       __builtin_offsetof(struct nat_entry, flags) == 18 &&
		       __builtin_offsetof(struct nat_entry, created) == 20,
	       "nat_entry: to_port, flags and created, an aligned word for a 64-bit compare and swap");

/* A slot of the half-open flows' tables (ns_maps.h: ct_half, snat_half):
 * a key and its value under a version word, odd while a CPU writes the
 * slot. A slot whose key's proto is 0 is empty. */
struct ct_half_slot {
	__u64 ver;
	struct ct_tuple key;
	struct ct_entry e;
};

struct nat_half_slot {
	__u64 ver;
	struct ct_tuple key;
	struct nat_entry n;
};

/* The flow cache (flowcache.h): per CPU, sets of NS_FLOW_WAYS entries
 * (NS_FLOW_SETS unless the agent sizes it), each what an established
 * masqueraded flow's packets (or its replies) become and where they go,
 * valid for one CT second. */
#define NS_FLOW_WAYS 4
#define NS_FLOW_SETS 1024 /* the default; 1 << fc_set_bits (flowcache.h) */

/* An entry is two cache lines, and sets start on one (flowcache.h). The
 * first holds all that an IPv4 packet's hit reads: the tuple's ports,
 * protocol and the last word of each address (an IPv4 address's whole),
 * what they become, the counters and the way out. The second holds the
 * first 12 bytes of each address (IPv4's are the v4-mapped prefix), read
 * for IPv6 and by the agent. An address is hi (12 bytes) then lo (4). */
struct ns_flow {
	__be32 saddr_lo;      /* the packet as received: source, */
	__be32 daddr_lo;      /* destination, */
	__be16 sport;
	__be16 dport;
	__u8   proto;
	__u8   dir;           /* CT_DIR_SERVICE (client -> frontend) or
			       * NAT_DIR_INGRESS (backend -> nat port) */
	__u8   v6;
	__u8   pad;
	__be32 to_saddr_lo;   /* what it becomes: source, */
	__be32 to_daddr_lo;   /* destination, */
	__be16 to_sport;
	__be16 to_dport;
	__u32  packets;       /* sent through this entry, not yet counted in the
			       * flow's CT entry */
	__u64  bytes;
	struct ct_fib fib;    /* how it leaves; fib.at: the CT second the entry
			       * holds for (0: none) */
	/* 64: the second line. */
	__u8   saddr_hi[12];
	__u8   daddr_hi[12];
	__u8   to_saddr_hi[12];
	__u8   to_daddr_hi[12];
	__u32  created;       /* its CT entry's: the counters go to that flow
			       * only, not to a later one on the same tuple */
	__u32  pad2[3];
};

struct ns_flow_set {
	struct ns_flow way[NS_FLOW_WAYS];
};

/* Key of the fragment map (frag.h): what every fragment of one datagram
 * carries. */
struct ns_frag_key {
	__u8   saddr[16];
	__u8   daddr[16];
	__be32 id;       /* IPv6's 32-bit identification; IPv4's 16-bit ID,
			  * zero-extended */
	__u8   proto;
	__u8   pad[3];
};

/* The ports of a datagram, from its first fragment. */
struct ns_frag_ports {
	__be16 sport;
	__be16 dport;
};

/* DSR tunnel endpoints: a pod CIDR (LPM) -> the IP of the node that hosts
 * it, the outer destination of the IPIP / IP6IP6 header. */
struct tunnel_key {
	__u32 prefixlen; /* of addr, 96 + n for an IPv4 /n (v4-mapped) */
	__u8  addr[16];
};

struct tunnel_val {
	__u8 node_addr[16]; /* v4-mapped for IPv4 */
};

/* Agent-written tc/XDP configuration, array index 0. Zero fields take the
 * defaults in ct.h (Cilium's timeouts), so a map the agent has not written
 * yet still gives a working datapath. */
struct ns_config {
	__u8  snat_addr4[16];    /* v4-mapped node IP used as SNAT source */
	__u8  snat_addr6[16];    /* node IPv6 used as SNAT source */
	__u64 clock_override;    /* tests only: the CT clock in seconds; 0 = jiffies */
	__u32 hz;                /* CONFIG_HZ, to turn jiffies into seconds */
	__u16 mode;              /* NS_MODE_* */
	__be16 dsr_gue_port;     /* network order: DSR's GUE port, decapsulated
				  * in every DSR mode; sent with NS_CFG_DSR_GUE.
				  * 0: IPIP only (an older agent's map: the
				  * field was mode's upper half) */
	__u32 tcp_syn_timeout;   /* seconds */
	__u32 tcp_est_timeout;
	__u32 tcp_close_timeout;
	__u32 udp_timeout;
	__u16 snat_port_min;     /* host order, inclusive */
	__u16 snat_port_max;
	__u16 snat_hole_min;     /* host order, inclusive: ports of the range
				  * never used (the NodePorts and the host's
				  * ephemeral ports in it); 0: none */
	__u16 snat_hole_max;
	__u32 hash_key;          /* keys the flow hash (backend slot, nat port):
				  * random per boot, kept by the pin */
	__u32 flags;             /* NS_CFG_* */
};

/* ns_config.flags */
/* tc delivers to a local pod through the host's stack (TC_ACT_OK: its
 * FORWARD chain, rp_filter and the veth's egress qdisc, where a policy
 * engine and the Pod's ingress limit live), not straight into the pod with
 * bpf_redirect_peer. The agent sets it unless --local-delivery=peer. XDP
 * always hands a local pod's packets to the stack. */
#define NS_CFG_LOCAL_VIA_STACK (1 << 0)
/* No netfilter handoff (nfct.h): --netfilter-handoff=false. */
#define NS_CFG_NO_NF_HANDOFF (1 << 1)
/* Unloading (the way back to kube-proxy): new flows go to the stack
 * untouched, established ones are still served (nodeport.h). */
#define NS_CFG_DRAIN (1 << 2)
/* Unloading, the live flows handed to netfilter's conntrack (nfexport):
 * a local backend's packets go to the stack untranslated, whose NAT entry
 * now translates them. Translated here, they would meet that entry's reply
 * tuple as a new flow, and netfilter would give them another client port
 * (a clash), which the backend answers with a reset. */
#define NS_CFG_HANDED_OVER (1 << 3)
/* DSR in GUE (UDP to dsr_gue_port, the source port from the flow hash):
 * --dsr-dispatch=gue. Else IPIP / IP6IP6. */
#define NS_CFG_DSR_GUE (1 << 4)
/* Unloading, the live flows being written into netfilter's conntrack: a
 * local backend's packets are dropped (handover) until
 * NS_CFG_HANDED_OVER. Translated here, one could meet an entry just
 * written as a new flow (the clash above, a reset); untranslated, it could
 * reach kube-proxy's rules before its entry is there (another backend, a
 * reset). TCP retransmits it once the entry is in place. */
#define NS_CFG_HANDING_OVER (1 << 5)

#endif /* __SLUICE_CT_ABI_H */
