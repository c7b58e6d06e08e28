package netparse

import "errors"

// Errors a Result can carry. Parse errors wrap them with the place where
// the input went wrong.
var (
	ErrNotIP        = errors.New("netparse: not an IPv4 or IPv6 packet")
	ErrTruncated    = errors.New("netparse: packet truncated")
	ErrMalformed    = errors.New("netparse: malformed packet")
	ErrChecksum     = errors.New("netparse: bad checksum")
	ErrIPv4Option   = errors.New("netparse: ipv4 option not handled")
	ErrIPv6Option   = errors.New("netparse: ipv6 option not handled")
	ErrRouting      = errors.New("netparse: ipv6 routing header redirects the packet")
	ErrExtChain     = errors.New("netparse: ipv6 extension header chain not handled")
	ErrFragOverlap  = errors.New("netparse: overlapping ip fragments")
	ErrFragTooMany  = errors.New("netparse: too many fragments in one datagram")
	ErrFragTooBig   = errors.New("netparse: reassembled datagram too big")
	ErrFragBad      = errors.New("netparse: invalid fragment")
	ErrFragFull     = errors.New("netparse: fragment table full")
	ErrFragRefused  = errors.New("netparse: fragment of a refused datagram")
	ErrTCPConflict  = errors.New("netparse: tcp retransmission carries different data")
	ErrTCPStale     = errors.New("netparse: tcp retransmission older than the retained bytes")
	ErrTCPWindow    = errors.New("netparse: tcp segment beyond the reassembly window")
	ErrTCPMemory    = errors.New("netparse: tcp reassembly memory exhausted")
	ErrFlowsFull    = errors.New("netparse: flow table full")
	ErrFlowRefused  = errors.New("netparse: segment of a refused flow")
	ErrRSTData      = errors.New("netparse: tcp reset carries data")
	ErrTCPUrgent    = errors.New("netparse: tcp urgent data not handled")
	ErrNoStreamData = errors.New("netparse: no stream data")
)
