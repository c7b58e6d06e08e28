package intercept

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/ip6_tables.h).
const ip6tSoOriginalDst = 80

// OriginalDst returns where a connection redirected to carbd's listener by
// netfilter NAT (REDIRECT or DNAT) was going: the conntrack entry's
// original destination, read with SO_ORIGINAL_DST (IPv4) or
// IP6T_SO_ORIGINAL_DST (IPv6). It is meant for Config.OrigDst when the
// redirect is a NAT rule; with TPROXY the local address is the original
// destination (the default).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("intercept: original destination: %T is not a TCP connection", c)
	}
	local, _ := addrPort(tc.LocalAddr())
	sc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("intercept: original destination: %w", err)
	}
	var dst netip.AddrPort
	var gerr error
	err = sc.Control(func(fd uintptr) {
		if local.Addr().Is4() || local.Addr().Is4In6() {
			// A sockaddr_in, read through the 20-byte ipv6_mreq shape.
			m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
			if err != nil {
				gerr = err
				return
			}
			b := m.Multiaddr[:]
			port := binary.BigEndian.Uint16(b[2:4])
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
			return
		}
		// A sockaddr_in6, read through the 32-byte ip6_mtuinfo shape.
		m, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.IPPROTO_IPV6, ip6tSoOriginalDst)
		if err != nil {
			gerr = err
			return
		}
		sa := m.Addr
		var p [2]byte // the port's bytes are in network order in memory
		binary.NativeEndian.PutUint16(p[:], sa.Port)
		dst = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), binary.BigEndian.Uint16(p[:]))
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return netip.AddrPort{}, fmt.Errorf("intercept: original destination of %s: no NAT entry (not redirected): %w", c.RemoteAddr(), err)
		}
		return netip.AddrPort{}, fmt.Errorf("intercept: original destination of %s: %w", c.RemoteAddr(), err)
	}
	return dst, nil
}
