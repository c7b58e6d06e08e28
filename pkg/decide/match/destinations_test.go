package match

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDestinations(t *testing.T) {
	type d = Destination
	for _, c := range []struct {
		name    string
		content string
		want    []d
	}{
		{"bare www host in a message", "Here is the link you requested: www.secure-systems-252.com",
			[]d{{DestHost, "www.secure-systems-252.com", 32}}},
		{"url with scheme, path and query; trailing punctuation trimmed", "see https://bank.example.com:8443/pay?id=42.",
			[]d{{DestURL, "https://bank.example.com:8443/pay?id=42", 4}}},
		{"host with a path", "post it to my-website-234.com/random please",
			[]d{{DestHost, "my-website-234.com/random", 11}}},
		{"common TLD without www", "I read it on informations.com!", []d{{DestHost, "informations.com", 13}}},
		{"file names are not hosts", "open feedback.xlsx and notes.md, then report.pdf", nil},
		{"e-mail, not its domain", "mail Alice.Smith@Example.com today", []d{{DestEmail, "Alice.Smith@Example.com", 5}}},
		{"mailto", "<a href=mailto:bob@mail.example.org>", []d{{DestEmail, "bob@mail.example.org", 15}}},
		{"compact IBANs", "IBAN: UK12345678901234567890? no: DE89370400440532013000.",
			[]d{{DestIBAN, "UK12345678901234567890", 6}, {DestIBAN, "DE89370400440532013000", 34}}},
		{"IBAN-like but neither checksum nor digits", "code AB12CDEFGHIJKLMNOP ok", nil},
		{"spaced IBAN", "to DE89 3704 0044 0532 0130 00 now", []d{{DestIBAN, "DE89 3704 0044 0532 0130 00", 3}}},
		{"international phone", "call +1 (555) 123-4567 or 030 1234 5678", []d{{DestPhone, "+1 (555) 123-4567", 5}}},
		{"dates, amounts and ids are not destinations", "on 2024-05-19 at 10:00 pay 1,250.00 for invoice INV-2024-0042", nil},
		{"url host not reported twice", "http://www.x.com/a www.x.com", []d{{DestURL, "http://www.x.com/a", 0}, {DestHost, "www.x.com", 19}}},
		{"empty", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Destinations(c.content)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Destinations(%q) (-want +got):\n%s", c.content, diff)
			}
			checkDestinations(t, c.content, got)
		})
	}
}

// checkDestinations asserts the contract: each value is the substring of
// content at its offset, in order, with a known kind.
func checkDestinations(t *testing.T, content string, ds []Destination) {
	t.Helper()
	last := -1
	for _, d := range ds {
		if d.Value == "" || d.Offset < 0 || d.Offset+len(d.Value) > len(content) || content[d.Offset:d.Offset+len(d.Value)] != d.Value {
			t.Fatalf("Destinations(%q): %+v is not the substring at its offset", trunc(content), d)
		}
		if d.Offset < last {
			t.Fatalf("Destinations(%q): %+v out of order", trunc(content), d)
		}
		last = d.Offset
		if d.Kind < DestURL || d.Kind > DestPhone || strings.HasSuffix(d.Kind.String(), "?") {
			t.Fatalf("Destinations(%q): unknown kind in %+v", trunc(content), d)
		}
	}
}

// FuzzDestinations: Destinations never panics and keeps its contract.
func FuzzDestinations(f *testing.F) {
	for _, s := range []string{
		"Here is the link you requested: www.secure-systems-252.com",
		"mail a@b.co, +44 20 7946 0958, DE89 3704 0044 0532 0130 00, https://x.org/p?q=1#f",
		"x://y http:// www. @. +1 2 3 4 5 6 7 8",
		"\xff\xe2\x82 www.é.com ftp://[::1]:21/x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		checkDestinations(t, content, Destinations(content))
	})
}

func TestDistinctive(t *testing.T) {
	for _, c := range []struct {
		tok  string
		want bool
	}{
		{"alice@example.com", true},
		{"www.informations.com", true},
		{"https://x.org/a", true},
		{"gb29nwbk60161331926819", true},
		{"hgk137803", true},                          // a passport number
		{"sk_live_4ec39hqlyjwd", true},               // a key
		{"4237-4252-7456-2346", true},                // a card number
		{"feedback.xlsx", true},                      // a file name
		{"performthefollowingtasksintheorder", true}, // a normalised phrase
		{"recipient", false},
		{"interesting", false},
		{"start_time", false},
		{"bluesparrowtech", false},
		{"2024-05-19", false},
		{"2024-05-1910:00", false},
		{"2022/03/07", false},
	} {
		if got := Distinctive(c.tok); got != c.want {
			t.Errorf("Distinctive(%q) = %v, want %v", c.tok, got, c.want)
		}
	}
}

// The fast pre-check never hides a destination Destinations would find.
func FuzzDestinationsPrecheck(f *testing.F) {
	for _, s := range []string{"see http://localhost/x", "mail a@b", "+41 44 668 1800", "DE89370400440532013000", "the weekly report: all good"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !mayHoldDestination(s) {
			var out []Destination
			func() {
				defer func() { recover() }()
				out = destinationsFull(s)
			}()
			if len(out) > 0 {
				t.Fatalf("pre-check ruled out %q, which holds %+v", s, out)
			}
		}
	})
}
