//go:build !linux

package intercept

import (
	"errors"
	"net"
	"net/netip"
)

// OriginalDst needs Linux netfilter.
func OriginalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("intercept: original destination: netfilter NAT is Linux only")
}
