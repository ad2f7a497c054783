/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the datapath tells the agent about the traffic it handles: drop
 * reasons, events and counters. The enums are the one list of reasons and
 * event types: internal/monitor reads them from the objects' BTF and a test
 * fails when its Go names drift from these. Addresses 16 bytes (IPv4
 * v4-mapped), ports network order, the rest host order. */
#ifndef __SLUICE_EVENTS_ABI_H
#define __SLUICE_EVENTS_ABI_H

#include <linux/types.h>

/* Why the datapath dropped (or refused) a packet. */
enum sl_drop_reason {
	SL_DROP_UNKNOWN = 0,       /* a drop no site named (a rewrite or helper failed) */
	SL_DROP_NO_BACKEND,        /* the Service has no serving endpoint */
	SL_DROP_NO_LOCAL_BACKEND,  /* externalTrafficPolicy Local, no endpoint on this node */
	SL_DROP_SRC_RANGE,         /* the client is outside loadBalancerSourceRanges */
	SL_DROP_CT_FULL,           /* conntrack could not take the new flow */
	SL_DROP_NAT_EXHAUSTED,     /* no free SNAT port toward that backend */
	SL_DROP_TOO_BIG,           /* too big for the path: answered with ICMP instead */
	SL_DROP_MALFORMED,         /* a header that does not parse */
	SL_DROP_DSR_UNKNOWN_NODE,  /* a DSR tunnel from an address that is no node's */
	SL_DROP_DSR_NO_SERVICE,    /* a DSR packet for a frontend with no local backend here */
	SL_DROP_FAMILY,            /* the backend is of the other IP family */
	SL_DROP_NO_CT,             /* a reply to a nat port whose flow is gone */
	SL_DROP_MARTIAN,           /* an address no packet from the wire may have
				    * (loopback, 0.0.0.0/8, v4-mapped, a multicast
				    * source; TCP to multicast or broadcast) */
	SL_DROP_HANDSHAKE,         /* a client packet of a half-open TCP flow that
				    * is not its handshake's ACK (a blind ACK) */
	SL_DROP_DSR_SPOOFED,       /* a DSR tunnel from a node's address, on a
				    * device or from a MAC the route to that node
				    * does not lead to */
	SL_DROP_DSR_TOO_LONG,      /* a GSO aggregate over 64 KiB (BIG TCP) that
				    * DSR's outer header cannot carry */
	SL_DROP_HANDOVER,          /* a local backend's packet while the agent
				    * writes its flows into netfilter's conntrack
				    * (unloading): TCP retransmits it */
	SL_DROP_MAX,
};

enum sl_event_type {
	SL_EV_DROP = 1,    /* a drop, reason set */
	SL_EV_SERVICE,     /* north-south: a new flow to a frontend, the backend chosen */
	SL_EV_SOCK,        /* socket LB: connect()/sendmsg() translated */
	SL_EV_CT_CLOSE,    /* a flow's FIN or RST seen: its entry is closing */
	SL_EV_CT_GC,       /* the agent's GC removed an expired entry (from Go) */
};

/* Where an event happened (sl_event.hook). */
enum sl_hook {
	SL_HOOK_TC_INGRESS = 1,
	SL_HOOK_TC_EGRESS,
	SL_HOOK_XDP,
	SL_HOOK_POD,       /* tc on a pod's veth (--socket-lb=false) */
	SL_HOOK_SOCK,      /* cgroup socket hooks */
};

/* How a north-south flow reaches its backend (sl_event.mode). */
enum sl_mode {
	SL_MODE_NONE = 0,
	SL_MODE_LOCAL,       /* a backend on this node: DNAT only */
	SL_MODE_SNAT,        /* a remote backend, masqueraded */
	SL_MODE_DSR,         /* a remote backend, tunnelled; it replies directly */
	SL_MODE_DSR_BACKEND, /* on the backend's node, from a DSR tunnel */
};

/* Event flags (sl_ev_config.flags): which events the datapath writes to
 * the ring. Drops are on by default (they are rare and rate-limited); the
 * others only while a reader asks for them. */
#define SL_EVF_DROP    (1 << 0)
#define SL_EVF_SERVICE (1 << 1)
#define SL_EVF_SOCK    (1 << 2)
#define SL_EVF_CT      (1 << 3)

struct sl_ev_config {
	__u32 flags; /* SL_EVF_* */
	__u32 rate;  /* events a second per CPU; 0 = none */
	__u32 hz;    /* CONFIG_HZ: the rate's second in jiffies (0: by ktime) */
	__u32 pad;
	/* No room taken: these put the event's layout and the enums into the
	 * objects' BTF (this is a map's value type), where the Go side checks
	 * its copy of them. */
	enum sl_drop_reason btf_reasons[0];
	enum sl_event_type  btf_types[0];
	enum sl_hook        btf_hooks[0];
	enum sl_mode        btf_modes[0];
};

/* Per CPU: the rate limiter's second (when it started, in jiffies, or
 * in ns without hz) and what it let through or held back. */
struct sl_ev_rate {
	__u64 start;
	__u32 sent;       /* this second */
	__u32 pad;
	__u64 suppressed; /* ever: over the rate or the ring full */
};

struct sl_event {
	__u64  ts;         /* bpf_ktime_get_ns: CLOCK_MONOTONIC */
	__u8   type;       /* SL_EV_* */
	__u8   reason;     /* SL_DROP_*, for SL_EV_DROP */
	__u8   hook;       /* SL_HOOK_* */
	__u8   mode;       /* SL_MODE_* */
	__u8   proto;
	__u8   tcp_flags;
	__u16  rev_nat_id; /* the frontend, when known (0: not) */
	__u32  ifindex;
	__u32  backend_id; /* 0: none */
	__u32  len;        /* packet bytes */
	__u8   saddr[16];  /* the packet as seen: source, */
	__u8   daddr[16];  /* destination (the frontend for a new flow), */
	__u8   baddr[16];  /* the backend chosen */
	__be16 sport;
	__be16 dport;
	__be16 bport;
	__u16  pad;
	__u64  cgroup;     /* SL_EV_SOCK: the socket's cgroup id */
	__u64  netns;      /* SL_EV_SOCK: its network namespace cookie */
};

/* The event's layout, into BTF as the enums are (sl_ev_config). */
struct sl_ev_btf {
	struct sl_ev_config config;
	struct sl_event     event[0];
};

/* Per frontend (rev_nat_id) and per backend (backend_id), per CPU. */
struct sl_counters {
	__u64 packets; /* client -> service (north-south) */
	__u64 bytes;
	__u64 conns;   /* new flows, and socket-LB translations */
};

/* Per drop reason, per CPU. */
struct sl_drop_count {
	__u64 packets;
	__u64 bytes;
};

#endif /* __SLUICE_EVENTS_ABI_H */
