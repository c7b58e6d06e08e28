//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * carbd's TC program: runs on INGRESS of the host side of the guest's
 * interface (the guest's egress), before anything else sees the packet.
 *
 * Every packet ends in one of three places:
 *   pass   skb->mark = CARBD_MARK_PASS (or _LINK), TC_ACT_OK
 *   queue  skb->mark = CARBD_MARK_QUEUE, TC_ACT_OK: netfilter queues it
 *   drop   TC_ACT_SHOT
 * and is counted under exactly one reason. Only TCP, UDP and ICMP echo of a
 * flow userspace released pass on the fast path; whatever the program cannot
 * parse is queued (policy decides it as opaque) or dropped, never passed.
 * docs/network.md describes the design.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "carbd/tc.h"
#include "carbd/read_gen.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Sizes are defaults: the loader sets max_entries before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_key);
	__type(value, struct flow_stats);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_key);
	__type(value, struct verdict);
} verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CARBD_NUM_REASONS);
	__type(key, __u32);
	__type(value, struct counter);
} counters SEC(".maps");

/* Wire formats, without bitfields so they read the same on either endianness. */
struct c_eth {
	__u8 dst[6];
	__u8 src[6];
	__be16 proto;
};

struct c_ipv4 {
	__u8 vihl; /* version << 4 | ihl */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off; /* flags << 13 | offset */
	__u8 ttl;
	__u8 proto;
	__be16 csum;
	__u8 saddr[4];
	__u8 daddr[4];
};

struct c_ipv6 {
	__u8 vtc[4]; /* version << 28 | traffic class | flow label */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct c_ext {
	__u8 nexthdr;
	__u8 hdrlen;
};

struct c_frag6 {
	__u8 nexthdr;
	__u8 reserved;
	__be16 off; /* offset << 3 | M */
	__be32 id;
};

struct c_tcp {
	__be16 sport;
	__be16 dport;
	__be32 seq;
	__be32 ack;
	__u8 doff; /* data offset << 4 */
	__u8 flags;
	__be16 window;
	__be16 csum;
	__be16 urg;
};

struct c_udp {
	__be16 sport;
	__be16 dport;
	__be16 len;
	__be16 csum;
};

struct c_icmp {
	__u8 type;
	__u8 code;
	__be16 csum;
	__be16 id;
	__be16 seq;
};

#define P_IPPROTO_HOPOPTS  0
#define P_IPPROTO_ICMP     1
#define P_IPPROTO_TCP      6
#define P_IPPROTO_UDP      17
#define P_IPPROTO_ROUTING  43
#define P_IPPROTO_FRAGMENT 44
#define P_IPPROTO_AH       51
#define P_IPPROTO_ICMPV6   58
#define P_IPPROTO_DSTOPTS  60

#define TCP_FLAG_SYN 0x02
#define IPV4_FRAG_MASK 0x3fff /* MF | fragment offset */
#define MAX_EXT_HDRS 8

enum parse_result {
	P_OK = 0,
	P_LINKLOCAL,
	P_MALFORMED,
};

struct pkt {
	struct flow_key key;
	__u32 seq;     /* TCP sequence number, host order */
	__u32 payload; /* TCP payload bytes */
	__u8 syn;
	__u8 frag;
	__u8 ipopts;
	__u8 opaque;
};

static __always_inline void count(__u32 reason, __u32 len)
{
	struct counter *c = bpf_map_lookup_elem(&counters, &reason);

	if (c) {
		c->packets++;
		c->bytes += len;
	}
}

static __always_inline void set_mark(struct __sk_buff *skb, __u32 mark)
{
	/* A volatile 32-bit store: clang would otherwise narrow it to a 16-bit
	 * store of the upper half, which the verifier refuses for ctx->mark. */
	*(volatile __u32 *)&skb->mark = (skb->mark & ~CARBD_MARK_MASK) | mark;
}

static __always_inline int drop(struct __sk_buff *skb, __u32 reason)
{
	count(reason, skb->len);
	return TC_ACT_SHOT;
}

static __always_inline int queue(struct __sk_buff *skb, __u32 reason)
{
	set_mark(skb, CARBD_MARK_QUEUE);
	count(reason, skb->len);
	return TC_ACT_OK;
}

static __always_inline int pass(struct __sk_buff *skb)
{
	set_mark(skb, CARBD_MARK_PASS);
	count(CARBD_PASS_FAST, skb->len);
	return TC_ACT_OK;
}

static __always_inline int pass_link(struct __sk_buff *skb)
{
	set_mark(skb, CARBD_MARK_LINK);
	count(CARBD_PASS_LINKLOCAL, skb->len);
	return TC_ACT_OK;
}

static __always_inline int lease_alive(__u64 now)
{
	__u32 zero = 0;
	struct config *c = bpf_map_lookup_elem(&config, &zero);

	return c && now <= c->alive_until_ns;
}

/*
 * read_since: the flow was released to its end at generation v->gen, and
 * the agent has read since (read_gen moved on), or the generation cannot
 * be read: its data goes to the queue, which brings the file tracer up to
 * date and re-releases or decides the flow again. Any other value than
 * the stamped one counts, so a map that was replaced or reset fails closed.
 */
static __always_inline int read_since(const struct verdict *v)
{
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(&read_gen, &zero);

	return !g || *(volatile __u64 *)g != v->gen;
}

static __always_inline void account_flow(struct flow_key *k, __u32 len, __u64 now)
{
	struct flow_stats *st = bpf_map_lookup_elem(&flows, k);

	if (!st) {
		struct flow_stats init = {
			.packets = 1,
			.bytes = len,
			.first_ns = now,
			.last_ns = now,
		};
		if (bpf_map_update_elem(&flows, k, &init, BPF_NOEXIST) == 0)
			return;
		/* Another CPU created it first. */
		st = bpf_map_lookup_elem(&flows, k);
		if (!st)
			return;
	}
	__sync_fetch_and_add(&st->packets, 1);
	__sync_fetch_and_add(&st->bytes, len);
	st->last_ns = now;
}

/*
 * ICMPv6 messages that stay on the link: neighbour discovery (133-137,
 * code 0, hop limit 255, RFC 4861 §6.1) and MLD (130-132, 143, hop limit 1,
 * RFC 2710/3810). They pass with CARBD_MARK_LINK, which netfilter accepts in
 * INPUT and drops in FORWARD.
 */
static __always_inline int icmp6_linklocal(__u8 type, __u8 code, __u8 hop_limit)
{
	if (type >= 133 && type <= 137)
		return code == 0 && hop_limit == 255;
	if ((type >= 130 && type <= 132) || type == 143)
		return hop_limit == 1;
	return 0;
}

/* Parses the transport header at off; end is where the IP payload ends. */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, __u32 end, __u8 proto,
				    int is6, __u8 hop_limit, struct pkt *p)
{
	p->key.proto = proto;

	if (proto == P_IPPROTO_TCP) {
		struct c_tcp th;
		__u32 hl;

		if (off + sizeof(th) > end || bpf_skb_load_bytes(skb, off, &th, sizeof(th)) < 0)
			return P_MALFORMED;
		hl = (__u32)(th.doff >> 4) * 4;
		if (hl < sizeof(th) || off + hl > end)
			return P_MALFORMED;
		p->key.sport = bpf_ntohs(th.sport);
		p->key.dport = bpf_ntohs(th.dport);
		p->seq = bpf_ntohl(th.seq);
		p->syn = (th.flags & TCP_FLAG_SYN) ? 1 : 0;
		p->payload = end - off - hl;
		return P_OK;
	}

	if (proto == P_IPPROTO_UDP) {
		struct c_udp uh;

		if (off + sizeof(uh) > end || bpf_skb_load_bytes(skb, off, &uh, sizeof(uh)) < 0)
			return P_MALFORMED;
		p->key.sport = bpf_ntohs(uh.sport);
		p->key.dport = bpf_ntohs(uh.dport);
		return P_OK;
	}

	if ((proto == P_IPPROTO_ICMP && !is6) || (proto == P_IPPROTO_ICMPV6 && is6)) {
		struct c_icmp ih;

		if (off + sizeof(ih) > end || bpf_skb_load_bytes(skb, off, &ih, sizeof(ih)) < 0)
			return P_MALFORMED;
		p->key.dport = (__u16)ih.type << 8 | ih.code;
		if ((!is6 && (ih.type == 8 || ih.type == 0)) || (is6 && (ih.type == 128 || ih.type == 129)))
			p->key.sport = bpf_ntohs(ih.id);
		if (is6 && icmp6_linklocal(ih.type, ih.code, hop_limit))
			return P_LINKLOCAL;
		return P_OK;
	}

	/* Any other protocol (SCTP, GRE, ESP, tunnels, ICMP in IPv6...): opaque. */
	p->opaque = 1;
	return P_OK;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	struct c_ipv4 iph;
	__u32 ihl, tot;

	if (bpf_skb_load_bytes(skb, off, &iph, sizeof(iph)) < 0)
		return P_MALFORMED;
	if ((iph.vihl >> 4) != 4)
		return P_MALFORMED;
	ihl = (__u32)(iph.vihl & 0xf) * 4;
	if (ihl < sizeof(iph))
		return P_MALFORMED;
	tot = bpf_ntohs(iph.tot_len);
	if (tot == 0 && skb->gso_size)
		tot = skb->len - off; /* BIG TCP: the length is the skb's */
	if (tot < ihl || off + tot > skb->len)
		return P_MALFORMED;

	p->key.family = 4;
	__builtin_memcpy(p->key.src, iph.saddr, 4);
	__builtin_memcpy(p->key.dst, iph.daddr, 4);
	p->key.proto = iph.proto;
	if (ihl > sizeof(iph))
		p->ipopts = 1;
	if (bpf_ntohs(iph.frag_off) & IPV4_FRAG_MASK) {
		p->frag = 1;
		return P_OK;
	}
	return parse_l4(skb, off + ihl, off + tot, iph.proto, 0, iph.ttl, p);
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	struct c_ipv6 ip6;
	__u32 plen, end, cur;
	__u8 nh;
	int i;

	if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
		return P_MALFORMED;
	if ((ip6.vtc[0] >> 4) != 6)
		return P_MALFORMED;
	plen = bpf_ntohs(ip6.payload_len);
	/* BIG TCP GSO packets carry no length. Otherwise a zero length is an
	 * empty payload (a jumbogram's options then do not fit: malformed). */
	if (plen == 0 && skb->gso_size)
		end = skb->len;
	else
		end = off + sizeof(ip6) + plen;
	if (end > skb->len || end < off + sizeof(ip6))
		return P_MALFORMED;

	p->key.family = 6;
	__builtin_memcpy(p->key.src, ip6.saddr, 16);
	__builtin_memcpy(p->key.dst, ip6.daddr, 16);

	nh = ip6.nexthdr;
	cur = off + sizeof(ip6);
	for (i = 0; i < MAX_EXT_HDRS; i++) {
		struct c_ext e;

		switch (nh) {
		case P_IPPROTO_HOPOPTS:
		case P_IPPROTO_ROUTING:
		case P_IPPROTO_DSTOPTS:
			/* Hop-by-hop options only directly after the fixed header (RFC 8200 §4.1). */
			if (nh == P_IPPROTO_HOPOPTS && i != 0)
				return P_MALFORMED;
			if (cur + 8 > end || bpf_skb_load_bytes(skb, cur, &e, sizeof(e)) < 0)
				return P_MALFORMED;
			/* A routing header sends the packet elsewhere than its destination. */
			if (nh == P_IPPROTO_ROUTING)
				p->ipopts = 1;
			nh = e.nexthdr;
			cur += ((__u32)e.hdrlen + 1) * 8;
			continue;
		case P_IPPROTO_AH:
			if (cur + 8 > end || bpf_skb_load_bytes(skb, cur, &e, sizeof(e)) < 0)
				return P_MALFORMED;
			nh = e.nexthdr;
			cur += ((__u32)e.hdrlen + 2) * 4;
			continue;
		case P_IPPROTO_FRAGMENT: {
			struct c_frag6 f;

			if (cur + sizeof(f) > end || bpf_skb_load_bytes(skb, cur, &f, sizeof(f)) < 0)
				return P_MALFORMED;
			p->key.proto = f.nexthdr;
			p->frag = 1;
			return P_OK;
		}
		default:
			return parse_l4(skb, cur, end, nh, 1, ip6.hop_limit, p);
		}
	}
	/* More extension headers than any real stack sends: opaque. */
	p->key.proto = nh;
	p->opaque = 1;
	return P_OK;
}

SEC("tc")
int carbd_ingress(struct __sk_buff *skb)
{
	struct pkt p;
	struct c_eth eth;
	struct verdict *v;
	__u64 now = bpf_ktime_get_ns();
	int r;

	__builtin_memset(&p, 0, sizeof(p));

	/* A tag the NIC stripped into the skb, or one left in the frame. */
	if (skb->vlan_present)
		return drop(skb, CARBD_DROP_VLAN);
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return drop(skb, CARBD_DROP_MALFORMED);

	switch (bpf_ntohs(eth.proto)) {
	case ETH_P_ARP:
		return pass_link(skb);
	case ETH_P_IP:
		r = parse_ipv4(skb, sizeof(eth), &p);
		break;
	case ETH_P_IPV6:
		r = parse_ipv6(skb, sizeof(eth), &p);
		break;
	case ETH_P_8021Q:
	case ETH_P_8021AD:
		return drop(skb, CARBD_DROP_VLAN);
	default:
		/* No netfilter queue can hold a non-IP frame: refuse it. */
		return drop(skb, CARBD_DROP_NON_IP);
	}

	if (r == P_LINKLOCAL)
		return pass_link(skb);
	if (!lease_alive(now))
		return drop(skb, CARBD_DROP_NO_DAEMON);
	if (r == P_MALFORMED)
		return drop(skb, CARBD_DROP_MALFORMED);

	/* Later fragments have no ports: netfilter's defrag reassembles the
	 * datagram before the queue and the verdict loop decides it whole. */
	if (p.frag)
		return queue(skb, CARBD_QUEUE_FRAGMENT);

	account_flow(&p.key, skb->len, now);

	v = bpf_map_lookup_elem(&verdicts, &p.key);
	if (v && v->action == CARBD_REFUSED)
		return drop(skb, CARBD_DROP_REFUSED);
	if (p.ipopts)
		return queue(skb, CARBD_QUEUE_IP_OPTIONS);
	if (p.opaque)
		return queue(skb, CARBD_QUEUE_OPAQUE);
	if (p.key.proto == P_IPPROTO_UDP && p.key.dport == 53)
		return queue(skb, CARBD_QUEUE_DNS);
	if (!v || v->action != CARBD_RELEASED)
		return queue(skb, CARBD_QUEUE_UNDECIDED);

	/* A flow released to its end whose content carbd does not see (TLS
	 * not intercepted, QUIC, a stream it cannot parse) is taken to carry
	 * everything the agent had read when it was decided. A packet with
	 * data after the agent read again goes to the queue. Pure ACK, FIN,
	 * RST carry no client bytes and pass. */
	if ((v->flags & CARBD_VF_READ_GEN) && (p.key.proto != P_IPPROTO_TCP || p.payload) &&
	    read_since(v))
		return queue(skb, CARBD_QUEUE_READ);

	if (p.key.proto == P_IPPROTO_TCP && (v->flags & CARBD_VF_TCP_RANGE)) {
		/* A SYN starts a new connection on this 5-tuple (port reuse): its
		 * sequence space is unrelated to the released range. Forget the
		 * verdict; the verdict loop decides the new connection. */
		if (p.syn) {
			bpf_map_delete_elem(&verdicts, &p.key);
			return queue(skb, CARBD_QUEUE_UNDECIDED);
		}
		/* Pure ACK, FIN, RST: no client bytes. Otherwise every byte
		 * must lie before seq_end (serial number arithmetic, so the
		 * comparison survives sequence wrap-around). */
		if (p.payload && (__s32)(p.seq + p.payload - v->seq_end) > 0)
			return queue(skb, CARBD_QUEUE_BEYOND_RANGE);
	}
	return pass(skb);
}
