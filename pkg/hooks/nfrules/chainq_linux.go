package nfrules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The xtables families as nftables sees them: iptables-nft keeps its
// chains in table filter of family ip, ip6tables-nft in family ip6.
var xtNFTFamilies = [...]uint8{unix.NFPROTO_IPV4, unix.NFPROTO_IPV6}

// xtChainsPresent reports whether any of chains exists in table filter of
// family (unix.NFPROTO_IPV4, NFPROTO_IPV6) in the caller's namespace. It
// asks the kernel for each chain by name (NFT_MSG_GETCHAIN, no dump), so
// its cost does not grow with the other sandboxes' rules the table
// holds, as an iptables-nft-save does. A missing table or chain is
// "absent"; any other answer is an error, and the caller then falls back
// to reading the table.
func xtChainsPresent(family uint8, chains []string) (bool, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return false, fmt.Errorf("nfrules: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, fmt.Errorf("nfrules: bind netlink socket: %w", err)
	}
	buf := make([]byte, os.Getpagesize())
	for i, c := range chains {
		seq := uint32(i + 1)
		if err := unix.Sendto(fd, getChainMsg(family, seq, "filter", c), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return false, fmt.Errorf("nfrules: ask for chain %s: %w", c, err)
		}
		found, err := readChainAnswer(fd, buf, seq)
		if err != nil {
			return false, fmt.Errorf("nfrules: chain %s: %w", c, err)
		}
		if found {
			return true, nil
		}
	}
	return false, nil
}

// getChainMsg is one NFT_MSG_GETCHAIN request for table/chain, with an
// acknowledgement asked for.
func getChainMsg(family uint8, seq uint32, table, chain string) []byte {
	attr := func(b []byte, typ uint16, s string) []byte {
		n := unix.SizeofNlAttr + len(s) + 1
		b = binary.NativeEndian.AppendUint16(b, uint16(n))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, s...)
		b = append(b, 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	// nfgenmsg: family, version, resource id (big endian).
	body := []byte{family, unix.NFNETLINK_V0, 0, 0}
	body = attr(body, unix.NFTA_CHAIN_TABLE, table)
	body = attr(body, unix.NFTA_CHAIN_NAME, chain)
	m := make([]byte, 0, unix.SizeofNlMsghdr+len(body))
	m = binary.NativeEndian.AppendUint32(m, uint32(unix.SizeofNlMsghdr+len(body)))
	m = binary.NativeEndian.AppendUint16(m, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETCHAIN)
	m = binary.NativeEndian.AppendUint16(m, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	m = binary.NativeEndian.AppendUint32(m, seq)
	m = binary.NativeEndian.AppendUint32(m, 0)
	return append(m, body...)
}

// readChainAnswer reads the kernel's answer to request seq: the chain
// (found), then the acknowledgement; or an error message, ENOENT meaning
// absent.
func readChainAnswer(fd int, buf []byte, seq uint32) (found bool, err error) {
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return false, fmt.Errorf("read netlink answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, fmt.Errorf("parse netlink answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return false, errors.New("short netlink error message")
				}
				code := int32(binary.NativeEndian.Uint32(m.Data[:4]))
				switch {
				case code == 0:
					return found, nil
				case unix.Errno(-code) == unix.ENOENT:
					return false, nil
				default:
					return false, unix.Errno(-code)
				}
			case unix.NLMSG_DONE:
				return found, nil
			case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN:
				found = true
			}
		}
	}
}
