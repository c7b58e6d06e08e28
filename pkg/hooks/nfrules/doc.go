// Package nfrules installs carbd's netfilter rules for one sandbox
// interface: the half of the network data path that acts on the marks
// carbd's TC program (pkg/hooks/tcx) puts on the guest's packets.
//
// In FORWARD and INPUT (traffic to the host's own addresses is egress
// too), for IPv4 and IPv6, every packet arriving on the interface meets,
// in order:
//
//	pass mark        -> on to the host's own rules (carbd never widens them)
//	link-local mark  -> on to the host's rules, INPUT only (ARP, ND, MLD)
//	queue mark       -> NFQUEUE --queue-num N, never --queue-bypass
//	anything else    -> DROP
//
// So with no TC program attached nothing from the interface gets through,
// and with no queue listener undecided traffic is dropped: carbd fails
// closed. The queue rule also matches every conntrack state, which makes
// netfilter track, and so defragment, the namespace's traffic: the queue
// sees whole datagrams.
//
// # Untracked sandboxes
//
// Tracking costs every forwarded packet a conntrack lookup and TCP state
// check, released flows included. A sandbox that nothing on the host
// needs tracked (no masquerade or redirect, no ct-state host rule for its
// flows) can set Config.Untracked to its networks: the plan then adds
// table inet carbd-raw-<id> (UntrackTable), which notracks, at raw
// priority, what arrives on the interface and what goes to those
// networks. The defragmenter runs before it (priority -400, still
// registered by the queue rule's conntrack match), so fragments still
// reach the queue whole, and the queue rule matches untracked packets
// too. Both directions are untracked, or neither: untracking only the
// released (pass-marked) packets leaves the entry of the connection's
// queued first packet to see the server acknowledge bytes it never saw,
// and conntrack then calls every reply INVALID (measured: 2,826 of a
// 2-second iperf3 upload's replies). carbd run masquerades, so it keeps
// tracking; the fair baseline for its released flows is the same NAT
// path without carbd.
//
// Build makes the rules as data (a Plan; pure, golden-tested); Apply
// installs them in one transaction per family; Remove deletes exactly
// carbd's chains and jumps (a clean stop; a crash leaves them, and egress
// stays dropped).
//
// # Backends
//
// The native nftables queue statement (table inet carbd-<id>, base chains
// at priority -10) where the kernel has it (CONFIG_NFT_QUEUE), else the
// xtables NFQUEUE target through iptables-nft/ip6tables-nft in chains
// CARBD-<id>-F and CARBD-<id>-I, jumped to from position 1 of FORWARD and
// INPUT. Detect probes which (the kernels of our CI lack nft_queue).
// The filter table, which holds every sandbox's chains, is read
// (iptables-nft-save) only when it must be: whether carbd's chains exist
// is asked by name through netlink, a fresh Apply restores without a
// save, and Remove tries the planned removal (which fails as a whole if
// the table differs from the plan) before reading the table.
//
// # Masquerading
//
// BuildNAT makes the NAT plan of a sandbox whose egress leaves through the
// host's routes: tables ip/ip6 carbd-nat-<id> masquerading its subnets on
// every interface but its own, and the forwarding sysctls it needs.
// ApplyNAT installs it (netlink, one transaction) and returns the undo.
// Forwarding is set only when it is off, and reference counted across
// sandboxes and processes in a state directory (DefaultSysctlDir; a lock
// file, the value found, one file per holder with its pid): the last
// sandbox to end puts back the value it found, unless someone changed it
// meanwhile. Holders that died are pruned by pid.
//
// # Requirements
//
// Linux, root (CAP_NET_ADMIN); for the xtables backend the iptables
// package (iptables-nft-save/-restore, ip6tables-nft-save/-restore).
//
// # Tests
//
// Plan rendering is compared with golden files (go test -update rewrites
// them: the rules, the raw table, the NAT plan) and runs anywhere; FuzzXtablesRemoval checks that the
// iptables-save parsing behind Apply and Remove only ever touches carbd's
// chains. The privileged tests install the rules in throwaway network
// namespaces (guest, router, world) and send real traffic through them:
// queued traffic with no listener, unmarked traffic, a host rule after
// carbd's, a misplaced jump, removal; released TCP and UDP flows in the
// conntrack table when tracked and absent (both directions) when
// untracked. Detect is checked against the nft
// tool; the native backend's table, built through netlink, is compared
// with its nft script as the kernel lists it (on kernels without
// nft_queue, with the queue rules as drops). The NAT plan is golden text
// too; in a throwaway namespace its script passes nft -c, forwarding is
// restored once the last of two sandboxes ends (and left on when it was
// on, and not held by a dead holder), and a guest's connection reaches the
// world from the router's address.
package nfrules
