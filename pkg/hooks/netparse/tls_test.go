package netparse

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestClientHelloReal(t *testing.T) {
	rec := realClientHello(t, "files.example.org", []string{"h2", "http/1.1"})
	msg, st, err := clientHelloFromRecords(rec, 1<<16, new([]byte))
	if st != tlsDone || err != nil {
		t.Fatalf("records: %v %v", st, err)
	}
	var ch ClientHello
	if err := parseClientHelloMsg(msg, &ch); err != nil {
		t.Fatal(err)
	}
	if string(ch.SNI) != "files.example.org" || len(ch.ALPN) != 2 || string(ch.ALPN[0]) != "h2" || ch.Version != 0x0304 || ch.LegacyVersion != 0x0303 {
		t.Fatalf("sni %q alpn %q version %#x legacy %#x", ch.SNI, ch.ALPN, ch.Version, ch.LegacyVersion)
	}
}

func TestClientHelloAcrossRecords(t *testing.T) {
	rec := realClientHello(t, "split.example", nil)
	body := rec[5:]
	// The same handshake message in three records.
	var split []byte
	for _, part := range [][]byte{body[:3], body[3:200], body[200:]} {
		split = append(split, 22, 3, 1)
		split = binary.BigEndian.AppendUint16(split, uint16(len(part)))
		split = append(split, part...)
	}
	scratch := new([]byte)
	for n := 0; n < len(split); n++ {
		if _, st, err := clientHelloFromRecords(split[:n], 1<<16, scratch); st != tlsMore || err != nil {
			t.Fatalf("prefix %d: %v %v", n, st, err)
		}
	}
	msg, st, err := clientHelloFromRecords(split, 1<<16, scratch)
	if st != tlsDone || err != nil {
		t.Fatalf("%v %v", st, err)
	}
	var ch ClientHello
	if err := parseClientHelloMsg(msg, &ch); err != nil || string(ch.SNI) != "split.example" {
		t.Fatalf("%v %q", err, ch.SNI)
	}
	if _, st, _ := clientHelloFromRecords(split, 100, scratch); st != tlsBig {
		t.Fatalf("limit: %v", st)
	}
}

// helloWith builds a ClientHello body with the given extensions block.
func helloWith(exts []byte) []byte {
	b := []byte{3, 3}
	b = append(b, make([]byte, 32)...)
	b = append(b, 0)                // session id
	b = append(b, 0, 2, 0x13, 0x01) // one cipher suite
	b = append(b, 1, 0)             // null compression
	b = binary.BigEndian.AppendUint16(b, uint16(len(exts)))
	return append(b, exts...)
}

func ext(typ uint16, data []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

func sni(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	return ext(0, append(binary.BigEndian.AppendUint16(nil, uint16(len(list))), list...))
}

func TestClientHelloMalformed(t *testing.T) {
	ok := helloWith(concat(sni("a.example"), ext(0xfe0d, []byte{1, 2, 3}), ext(43, []byte{4, 0x0a, 0x0a, 3, 4})))
	var ch ClientHello
	if err := parseClientHello(ok, &ch); err != nil || string(ch.SNI) != "a.example" || !ch.ECH || ch.Version != 0x0304 {
		t.Fatalf("%v sni %q ech %v version %#x", err, ch.SNI, ch.ECH, ch.Version)
	}
	bad := map[string][]byte{
		"duplicate extension": helloWith(concat(sni("a"), sni("b"))),
		"two host names":      helloWith(sni("a", "b")),
		"empty host name":     helloWith(sni("")),
		"extension overrun":   helloWith(ext(0, []byte{0, 9, 0, 0, 5, 'a'})),
		"trailing bytes":      append(helloWith(sni("a")), 0),
		"truncated":           helloWith(sni("a.example"))[:40],
		"odd cipher suites":   append(append([]byte{3, 3}, make([]byte, 33)...), 0, 3, 1, 2, 3, 1, 0),
		"empty alpn protocol": helloWith(ext(16, []byte{0, 1, 0})),
	}
	for name, b := range bad {
		if err := parseClientHello(b, &ch); !errors.Is(err, ErrTLS) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, st, _ := clientHelloFromRecords([]byte{23, 3, 3, 0, 1, 0}, 1<<16, new([]byte)); st != tlsBad {
		t.Errorf("application data record: %v", st)
	}
}
