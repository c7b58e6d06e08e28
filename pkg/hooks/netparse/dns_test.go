package netparse

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/dns/dnsmessage"
)

func TestDNSQuery(t *testing.T) {
	msg := dnsQuery(t, 0x1234, "Exfil-c2VjcmV0.attacker.example.", 16)
	var q DNSQuery
	if err := parseDNSQuery(msg, &q); err != nil {
		t.Fatal(err)
	}
	if len(q.Questions) != 1 || string(q.Questions[0].Name) != "Exfil-c2VjcmV0.attacker.example" || q.Questions[0].Type != 16 || q.ExtraRecords {
		t.Fatalf("%+v", q)
	}
	p := newParser(t, Config{})
	r := p.Feed(udpPkt(t, ap("10.0.0.2:5353"), ap("10.0.0.53:53"), msg), Meta{Time: t0})
	ev := r.Effects[0].Event()
	if ev.Op != "dns:query" || ev.Obj != "Exfil-c2VjcmV0.attacker.example" || ev.Dest.Host != ev.Obj || ev.Opaque {
		t.Fatalf("%+v", ev)
	}
	if ev.Fields[0].Name != FieldQName || ev.Fields[1].Value != "TXT" || ev.Fields[2].Value != "IN" {
		t.Fatalf("fields %+v", ev.Fields)
	}
	// A malformed query is an opaque effect, not a pass.
	r = p.Feed(udpPkt(t, ap("10.0.0.2:5353"), ap("10.0.0.53:53"), []byte("not dns at all")), Meta{Time: t0})
	if r.Action != Decide || !errors.Is(r.Effects[0].Opaque, ErrDNS) || !r.Effects[0].Event().Opaque {
		t.Fatalf("malformed: %v %+v", r.Action, r.Effects)
	}
}

func TestDNSNames(t *testing.T) {
	hdr := []byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	tests := []struct {
		name string
		msg  []byte
		want string
		err  bool
	}{
		{"escapes", concat(hdr, []byte{3, 'a', '.', 'b', 2, 0xff, ' ', 0, 0, 1, 0, 1}), `a\046b.\255\032`, false},
		{"root", concat(hdr, []byte{0, 0, 2, 0, 1}), ".", false},
		{"pointer forward", concat(hdr, []byte{0xc0, 20, 0, 1, 0, 1}), "", true},
		{"pointer to itself", concat(hdr, []byte{0xc0, 12, 0, 1, 0, 1}), "", true},
		{"label type 0x40", concat(hdr, []byte{0x41, 'a', 0, 0, 1, 0, 1}), "", true},
		{"label past end", concat(hdr, []byte{9, 'a'}), "", true},
		{"too long", concat(hdr, func() []byte {
			var b []byte
			for i := 0; i < 5; i++ {
				b = append(b, 63)
				b = append(b, make([]byte, 63)...)
			}
			return append(b, 0, 0, 1, 0, 1)
		}()), "", true},
		{"no questions", []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "", true},
		{"response bit", []byte{0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}, "", true},
	}
	for _, tc := range tests {
		var q DNSQuery
		err := parseDNSQuery(tc.msg, &q)
		if tc.err {
			if !errors.Is(err, ErrDNS) {
				t.Errorf("%s: err %v", tc.name, err)
			}
			continue
		}
		if err != nil || string(q.Questions[0].Name) != tc.want {
			t.Errorf("%s: %v %q, want %q", tc.name, err, q.Questions[0].Name, tc.want)
		}
	}
	// Extra records in a query are content and flagged.
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 9})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("x.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	_ = b.StartAnswers()
	_ = b.TXTResource(dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("x.example."), Class: dnsmessage.ClassINET}, dnsmessage.TXTResource{TXT: []string{"smuggled"}})
	msg, _ := b.Finish()
	var q DNSQuery
	if err := parseDNSQuery(msg, &q); err != nil || !q.ExtraRecords || len(q.Extra) == 0 {
		t.Fatalf("extra records: %v %v %d", err, q.ExtraRecords, len(q.Extra))
	}
}

func TestDNSAnswer(t *testing.T) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 3, Response: true, RecursionAvailable: true})
	b.EnableCompression()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	n := dnsmessage.MustNewName
	rh := func(name string, typ dnsmessage.Type) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: n(name), Type: typ, Class: dnsmessage.ClassINET, TTL: 60}
	}
	must(b.StartQuestions())
	must(b.Question(dnsmessage.Question{Name: n("WWW.Example.com."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}))
	must(b.StartAnswers())
	must(b.CNAMEResource(rh("www.example.com.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: n("edge.cdn.example.net.")}))
	must(b.CNAMEResource(rh("edge.cdn.example.net.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: n("e1.cdn.example.net.")}))
	must(b.AResource(rh("e1.cdn.example.net.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{192, 0, 2, 10}}))
	must(b.AAAAResource(rh("e1.cdn.example.net.", dnsmessage.TypeAAAA), dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::10").As16()}))
	// An unrelated record must not map a name the guest did not ask for.
	must(b.AResource(rh("bank.example.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{203, 0, 113, 66}}))
	msg, err := b.Finish()
	must(err)
	a, err := ParseDNSAnswer(msg)
	must(err)
	want := map[string][]netip.Addr{}
	for _, name := range []string{"www.example.com", "edge.cdn.example.net", "e1.cdn.example.net"} {
		want[name] = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
	}
	if diff := cmp.Diff(want, a.Addrs(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("addrs (-want +got):\n%s", diff)
	}
	if len(a.Answers) != 5 || a.Answers[0].Target != "edge.cdn.example.net" || a.ID != 3 {
		t.Errorf("answers %+v", a.Answers)
	}
	if _, err := ParseDNSAnswer(dnsQuery(t, 1, "q.example.", 1)); !errors.Is(err, ErrDNS) {
		t.Errorf("query as answer: %v", err)
	}
	if _, err := ParseDNSAnswer(msg[:len(msg)-3]); !errors.Is(err, ErrDNS) {
		t.Errorf("truncated: %v", err)
	}
	// A CNAME loop ends.
	b = dnsmessage.NewBuilder(nil, dnsmessage.Header{Response: true})
	must(b.StartQuestions())
	must(b.Question(dnsmessage.Question{Name: n("a.example."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}))
	must(b.StartAnswers())
	must(b.CNAMEResource(rh("a.example.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: n("b.example.")}))
	must(b.CNAMEResource(rh("b.example.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: n("a.example.")}))
	must(b.AResource(rh("b.example.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}}))
	msg, _ = b.Finish()
	a, err = ParseDNSAnswer(msg)
	must(err)
	if got := a.Addrs(); len(got) != 2 || len(got["a.example"]) != 1 {
		t.Errorf("loop: %v", got)
	}
}
