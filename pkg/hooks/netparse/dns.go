package netparse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ErrDNS marks a DNS message carbd cannot read.
var ErrDNS = errors.New("netparse: malformed dns message")

// DNS record types and classes carbd names.
const (
	TypeA     = 1
	TypeCNAME = 5
	TypeAAAA  = 28
	TypeOPT   = 41
	ClassIN   = 1
)

const (
	maxQuestions = 8
	maxNameWire  = 255
	maxPointers  = 64
)

// DNSQuestion is one question of a query. Name is in presentation form
// (labels joined by dots, no trailing dot; "." for the root; bytes outside
// letters, digits, '-' and '_' escaped as \DDD), a view into the parser's
// buffer.
type DNSQuestion struct {
	Name  []byte
	Type  uint16
	Class uint16
}

// DNSQuery is a DNS query the guest sends.
type DNSQuery struct {
	ID        uint16
	Opcode    uint8
	Flags     uint16
	Questions []DNSQuestion
	// Extra is the message after the question section (EDNS options and
	// any records); it leaves with the query, so it is content.
	Extra []byte
	// ExtraRecords says the query carries records other than one EDNS OPT
	// record (answers, authority, or more additional records).
	ExtraRecords bool
	names        []byte
	offs         [maxQuestions][2]int
}

func (q *DNSQuery) reset() {
	qs, names := q.Questions[:0], q.names[:0]
	*q = DNSQuery{Questions: qs, names: names}
}

// parseDNSQuery parses a query message. It allocates nothing once the
// query's buffers have grown.
func parseDNSQuery(msg []byte, q *DNSQuery) error {
	q.reset()
	if len(msg) < 12 {
		return fmt.Errorf("%w: header needs 12 bytes, have %d", ErrDNS, len(msg))
	}
	q.ID = binary.BigEndian.Uint16(msg[0:2])
	q.Flags = binary.BigEndian.Uint16(msg[2:4])
	q.Opcode = uint8(q.Flags>>11) & 0x0f
	if q.Flags&0x8000 != 0 {
		return fmt.Errorf("%w: response bit set in a message the guest sends", ErrDNS)
	}
	qd := int(binary.BigEndian.Uint16(msg[4:6]))
	an := binary.BigEndian.Uint16(msg[6:8])
	ns := binary.BigEndian.Uint16(msg[8:10])
	ar := binary.BigEndian.Uint16(msg[10:12])
	if qd == 0 || qd > maxQuestions {
		return fmt.Errorf("%w: %d questions", ErrDNS, qd)
	}
	off := 12
	for i := 0; i < qd; i++ {
		start := len(q.names)
		var err error
		q.names, off, err = appendName(q.names, msg, off)
		if err != nil {
			return fmt.Errorf("%w (question %d)", err, i+1)
		}
		if len(msg)-off < 4 {
			return fmt.Errorf("%w: question %d type and class", ErrDNS, i+1)
		}
		q.offs[i] = [2]int{start, len(q.names)}
		q.Questions = append(q.Questions, DNSQuestion{
			Type:  binary.BigEndian.Uint16(msg[off : off+2]),
			Class: binary.BigEndian.Uint16(msg[off+2 : off+4]),
		})
		off += 4
	}
	for i := range q.Questions {
		q.Questions[i].Name = q.names[q.offs[i][0]:q.offs[i][1]]
	}
	q.Extra = msg[off:]
	switch {
	case an != 0 || ns != 0 || ar > 1:
		q.ExtraRecords = true
	case ar == 1:
		// One OPT record: root name, type 41.
		if len(q.Extra) < 11 || q.Extra[0] != 0 || binary.BigEndian.Uint16(q.Extra[1:3]) != TypeOPT {
			q.ExtraRecords = true
		}
	case len(q.Extra) > 0:
		q.ExtraRecords = true
	}
	return nil
}

// appendName decodes the domain name at msg[off:] in presentation form,
// following compression pointers (only backwards, so decoding ends), and
// returns the offset after the name where it started.
func appendName(dst, msg []byte, off int) ([]byte, int, error) {
	next := -1
	wire := 0
	first := true
	limit := off // pointers must point before this
	for jumps := 0; ; {
		if off >= len(msg) {
			return dst, 0, fmt.Errorf("%w: name runs past the message", ErrDNS)
		}
		c := int(msg[off])
		switch c & 0xc0 {
		case 0xc0:
			if off+1 >= len(msg) {
				return dst, 0, fmt.Errorf("%w: truncated compression pointer", ErrDNS)
			}
			ptr := (c&0x3f)<<8 | int(msg[off+1])
			if next < 0 {
				next = off + 2
			}
			if ptr >= limit {
				return dst, 0, fmt.Errorf("%w: compression pointer %d does not point backwards", ErrDNS, ptr)
			}
			if jumps++; jumps > maxPointers {
				return dst, 0, fmt.Errorf("%w: too many compression pointers", ErrDNS)
			}
			off, limit = ptr, ptr
			continue
		case 0x40, 0x80:
			return dst, 0, fmt.Errorf("%w: label type %#x", ErrDNS, c&0xc0)
		}
		off++
		wire += 1 + c
		if wire > maxNameWire {
			return dst, 0, fmt.Errorf("%w: name longer than %d bytes", ErrDNS, maxNameWire)
		}
		if c == 0 {
			if first {
				dst = append(dst, '.')
			}
			if next < 0 {
				next = off
			}
			return dst, next, nil
		}
		if off+c > len(msg) {
			return dst, 0, fmt.Errorf("%w: label runs past the message", ErrDNS)
		}
		if !first {
			dst = append(dst, '.')
		}
		first = false
		for _, b := range msg[off : off+c] {
			switch {
			case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '-', b == '_', b == '*':
				dst = append(dst, b)
			default:
				dst = append(dst, '\\', '0'+b/100, '0'+b/10%10, '0'+b%10)
			}
		}
		off += c
	}
}

// TypeName names a DNS record type ("A", "AAAA", "TYPE65534").
func TypeName(t uint16) string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// ClassName names a DNS class ("IN", "CLASS7").
func ClassName(c uint16) string {
	switch c {
	case 1:
		return "IN"
	case 3:
		return "CH"
	case 4:
		return "HS"
	case 255:
		return "ANY"
	}
	return "CLASS" + strconv.Itoa(int(c))
}

var typeNames = map[uint16]string{
	1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 13: "HINFO", 15: "MX", 16: "TXT",
	28: "AAAA", 33: "SRV", 35: "NAPTR", 41: "OPT", 43: "DS", 46: "RRSIG", 47: "NSEC",
	48: "DNSKEY", 50: "NSEC3", 52: "TLSA", 64: "SVCB", 65: "HTTPS", 99: "SPF",
	251: "IXFR", 252: "AXFR", 255: "ANY", 257: "CAA",
}

// DNSRecord is one resource record of a response.
type DNSRecord struct {
	Name   string // lowercase presentation form, no trailing dot
	Type   uint16
	Class  uint16
	TTL    uint32
	Addr   netip.Addr // A and AAAA
	Target string     // CNAME: lowercase, no trailing dot
}

// DNSAnswer is a DNS response (world -> guest).
type DNSAnswer struct {
	ID        uint16
	RCode     uint8
	Truncated bool // TC bit: the full answer needs TCP
	Questions []DNSQuestionName
	// Answers is the answer section; authority and additional records are
	// not used to map names to addresses.
	Answers []DNSRecord
}

// DNSQuestionName is a question of a response.
type DNSQuestionName struct {
	Name        string
	Type, Class uint16
}

// ParseDNSAnswer parses a DNS response message (over TCP, without its
// 2-byte length prefix).
func ParseDNSAnswer(msg []byte) (*DNSAnswer, error) {
	if len(msg) < 12 {
		return nil, fmt.Errorf("%w: header needs 12 bytes, have %d", ErrDNS, len(msg))
	}
	flags := binary.BigEndian.Uint16(msg[2:4])
	if flags&0x8000 == 0 {
		return nil, fmt.Errorf("%w: not a response (QR bit clear)", ErrDNS)
	}
	a := &DNSAnswer{ID: binary.BigEndian.Uint16(msg[0:2]), RCode: uint8(flags & 0x0f), Truncated: flags&0x0200 != 0}
	qd := int(binary.BigEndian.Uint16(msg[4:6]))
	an := int(binary.BigEndian.Uint16(msg[6:8]))
	if qd > maxQuestions {
		return nil, fmt.Errorf("%w: %d questions", ErrDNS, qd)
	}
	off := 12
	var buf []byte
	for i := 0; i < qd; i++ {
		var err error
		buf, off, err = appendName(buf[:0], msg, off)
		if err != nil {
			return nil, fmt.Errorf("%w (question %d)", err, i+1)
		}
		if len(msg)-off < 4 {
			return nil, fmt.Errorf("%w: question %d type and class", ErrDNS, i+1)
		}
		a.Questions = append(a.Questions, DNSQuestionName{
			Name:  canonicalName(buf),
			Type:  binary.BigEndian.Uint16(msg[off:]),
			Class: binary.BigEndian.Uint16(msg[off+2:]),
		})
		off += 4
	}
	for i := 0; i < an; i++ {
		var err error
		buf, off, err = appendName(buf[:0], msg, off)
		if err != nil {
			return nil, fmt.Errorf("%w (answer %d)", err, i+1)
		}
		if len(msg)-off < 10 {
			return nil, fmt.Errorf("%w: answer %d header", ErrDNS, i+1)
		}
		rr := DNSRecord{
			Name:  canonicalName(buf),
			Type:  binary.BigEndian.Uint16(msg[off:]),
			Class: binary.BigEndian.Uint16(msg[off+2:]),
			TTL:   binary.BigEndian.Uint32(msg[off+4:]),
		}
		rdlen := int(binary.BigEndian.Uint16(msg[off+8:]))
		off += 10
		if len(msg)-off < rdlen {
			return nil, fmt.Errorf("%w: answer %d data of %d bytes, have %d", ErrDNS, i+1, rdlen, len(msg)-off)
		}
		rdata := msg[off : off+rdlen]
		switch rr.Type {
		case TypeA:
			if rdlen != 4 {
				return nil, fmt.Errorf("%w: answer %d: A record of %d bytes", ErrDNS, i+1, rdlen)
			}
			rr.Addr = netip.AddrFrom4([4]byte(rdata))
		case TypeAAAA:
			if rdlen != 16 {
				return nil, fmt.Errorf("%w: answer %d: AAAA record of %d bytes", ErrDNS, i+1, rdlen)
			}
			rr.Addr = netip.AddrFrom16([16]byte(rdata))
		case TypeCNAME:
			var tgt []byte
			var end int
			tgt, end, err = appendName(nil, msg[:off+rdlen], off)
			if err != nil {
				return nil, fmt.Errorf("%w (answer %d CNAME target)", err, i+1)
			}
			if end != off+rdlen {
				return nil, fmt.Errorf("%w: answer %d: CNAME data length", ErrDNS, i+1)
			}
			rr.Target = canonicalName(tgt)
		}
		off += rdlen
		a.Answers = append(a.Answers, rr)
	}
	return a, nil
}

// canonicalName lowercases a presentation-form name; the root stays ".".
func canonicalName(b []byte) string {
	return strings.ToLower(string(b))
}

// maxChain bounds CNAME chains.
const maxChain = 16

// Addrs maps each name the response answers for to its addresses: every
// question name and every name on its CNAME chain maps to the A and AAAA
// records found at the end of the chain (and along it). Records for names
// that no question leads to are ignored, so a response cannot attach an
// address to an unrelated name.
func (a *DNSAnswer) Addrs() map[string][]netip.Addr {
	out := make(map[string][]netip.Addr)
	for _, q := range a.Questions {
		chain := []string{q.Name}
		for len(chain) <= maxChain {
			cur := chain[len(chain)-1]
			next := ""
			for _, rr := range a.Answers {
				if rr.Type == TypeCNAME && rr.Name == cur {
					next = rr.Target
					break
				}
			}
			if next == "" || containsString(chain, next) {
				break
			}
			chain = append(chain, next)
		}
		var addrs []netip.Addr
		for _, rr := range a.Answers {
			if rr.Addr.IsValid() && containsString(chain, rr.Name) && !containsAddr(addrs, rr.Addr) {
				addrs = append(addrs, rr.Addr)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		for _, n := range chain {
			for _, ad := range addrs {
				if !containsAddr(out[n], ad) {
					out[n] = append(out[n], ad)
				}
			}
		}
	}
	return out
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsAddr(s []netip.Addr, v netip.Addr) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
