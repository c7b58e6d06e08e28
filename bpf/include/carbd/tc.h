/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The contract between bpf/tc.c and its Go loader, pkg/hooks/tcx: marks,
 * map layouts, verdicts and counter indices. pkg/hooks/tcx mirrors every
 * definition here and its tests check the mirror against the BTF of the
 * compiled object and against the program's behaviour. Change both sides
 * together.
 */
#ifndef CARBD_TC_H
#define CARBD_TC_H

#include <linux/types.h>

/*
 * skb->mark values. Only the bits in CARBD_MARK_MASK belong to carbd; the
 * program keeps the other bits as they were.
 */
#define CARBD_MARK_MASK  0xffff0000u
#define CARBD_MARK_PASS  0xcb010000u /* decided: netfilter lets it through */
#define CARBD_MARK_QUEUE 0xcb020000u /* undecided: netfilter queues it     */
#define CARBD_MARK_LINK  0xcb030000u /* ARP, ND, MLD: host only, never forwarded */

/* The 5-tuple of a flow as the guest sends it (guest -> world). */
struct flow_key {
	__u8 family;   /* 4 or 6 */
	__u8 proto;    /* IP protocol number */
	__u16 sport;   /* host byte order; ICMP echo: identifier, other ICMP: 0 */
	__u16 dport;   /* host byte order; ICMP: type << 8 | code */
	__u16 pad;     /* always 0 */
	__u8 src[16];  /* IPv4: first 4 bytes, rest 0 */
	__u8 dst[16];
};

/* Per-flow state, written by the program only. */
struct flow_stats {
	__u64 packets;
	__u64 bytes;    /* skb->len, Ethernet header included */
	__u64 first_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u64 last_ns;
};

/* verdict.action */
#define CARBD_UNDECIDED 0
#define CARBD_RELEASED  1
#define CARBD_REFUSED   2

/* verdict.flags */
#define CARBD_VF_TCP_RANGE 1 /* TCP: only client bytes before seq_end pass */
#define CARBD_VF_READ_GEN  2 /* released at read generation gen: see read_gen.h */

/* Per-flow verdict, written by userspace only. */
struct verdict {
	__u8 action;
	__u8 flags;
	__u16 pad;
	__u32 seq_end; /* TCP sequence number (host order) ending the released bytes */
	__u64 gen;     /* CARBD_VF_READ_GEN: read_gen when the release was decided */
};

/* The single entry of the config map. */
struct config {
	__u64 alive_until_ns; /* liveness lease: after it, drop all but ARP/ND */
	__u32 ifindex;        /* where the program is attached (for adoption) */
	__u32 attach_mode;    /* 1 tcx, 2 legacy clsact */
};

/* Global counters: a per-CPU array indexed by reason. */
struct counter {
	__u64 packets;
	__u64 bytes;
};

enum counter_reason {
	CARBD_PASS_FAST = 0,       /* released flow on the fast path */
	CARBD_PASS_LINKLOCAL,      /* ARP, ND, MLD */
	CARBD_QUEUE_UNDECIDED,     /* no verdict yet (or a SYN on a byte-range flow) */
	CARBD_QUEUE_BEYOND_RANGE,  /* TCP payload past the released byte range */
	CARBD_QUEUE_DNS,           /* UDP to port 53: every query is an effect */
	CARBD_QUEUE_FRAGMENT,      /* IP fragment: netfilter reassembles, then queues */
	CARBD_QUEUE_IP_OPTIONS,    /* IPv4 options or IPv6 routing header */
	CARBD_QUEUE_OPAQUE,        /* an IP protocol the fast path does not know */
	CARBD_QUEUE_READ,          /* released at an older read generation: the agent read since */
	CARBD_DROP_REFUSED,        /* the flow is refused */
	CARBD_DROP_NO_DAEMON,      /* the liveness lease expired */
	CARBD_DROP_MALFORMED,      /* truncated or inconsistent headers */
	CARBD_DROP_VLAN,           /* 802.1Q / 802.1ad tagged frame */
	CARBD_DROP_NON_IP,         /* an ethertype other than IPv4, IPv6, ARP */
	CARBD_NUM_REASONS,
};

#endif /* CARBD_TC_H */
