package match

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// checkExtract asserts the contract of Extract: non-empty values, each a
// substring of content (so its Norm occurs in Norm(content)), no repeats.
func checkExtract(t *testing.T, content string, vals []string) {
	t.Helper()
	nc := Norm(content)
	seen := map[string]bool{}
	for _, v := range vals {
		if v == "" {
			t.Fatalf("Extract(%q) returned an empty value", trunc(content))
		}
		if !strings.Contains(content, v) {
			t.Fatalf("Extract(%q) returned %q, not a substring", trunc(content), v)
		}
		if !strings.Contains(nc, Norm(v)) {
			t.Fatalf("Extract(%q) returned %q whose Norm %q is not in Norm(content)", trunc(content), v, Norm(v))
		}
		if seen[v] {
			t.Fatalf("Extract(%q) returned %q twice", trunc(content), v)
		}
		seen[v] = true
	}
}

func TestExtract(t *testing.T) {
	for _, c := range []struct {
		name    string
		content string
		want    []string // must be among the values
		not     []string // must not be
	}{
		{
			name:    "task",
			content: `Pay the bill in bill.txt to DE89 3704 0044 0532 0130 00 (amount 1,250.00 EUR) and e-mail the receipt to Alice.Smith@Example.com; see https://bank.example.com:8443/pay?id=42#top.`,
			want: []string{
				"bill.txt", "DE89 3704 0044 0532 0130 00", "1,250.00", "Alice.Smith@Example.com",
				"https://bank.example.com:8443/pay?id=42#top", "https://bank.example.com:8443/pay",
				"bank.example.com", "bank.example.com:8443", "receipt", "42",
			},
			not: []string{"DE89 3704 0044 0532 0130 00 (amount", "see", "the", "to"},
		},
		{
			name:    "whole short content",
			content: "  Quarterly Report.pdf \n",
			want:    []string{"Quarterly Report.pdf", "Quarterly", "Report.pdf"},
		},
		{
			name:    "quotes and apostrophes",
			content: `He said "send it to ops" and it's 'done' — don't ‘pair’ “these words” «ok» „ja“`,
			want:    []string{"send it to ops", "done", "pair", "these words", "ok", "ja"},
			not:     []string{"s 'done' — don", "t ‘pair"},
		},
		{
			name:    "json",
			content: `{"iban": "GB82WEST12345698765432", "token": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "n": 7}`,
			want:    []string{"iban", "GB82WEST12345698765432", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "token"},
			not:     []string{"7"},
		},
		{
			name:    "key value and paths",
			content: "export API_KEY=abc123secret; cat /etc/ssl/private/server.key ~/notes/todo.md C:\\Users\\bob\\secret.docx file:///var/lib/data.db",
			want: []string{
				"API_KEY=abc123secret", "API_KEY", "abc123secret", "/etc/ssl/private/server.key", "server.key",
				"~/notes/todo.md", "todo.md", `C:\Users\bob\secret.docx`, "secret.docx", "file:///var/lib/data.db", "/var/lib/data.db",
			},
		},
		{
			name:    "phones and grouped numbers",
			content: "Call +1 (555) 123-4567 or 030 1234 5678, card 4111 1111 1111 1111, ext 12, in 2026.",
			want:    []string{"+1 (555) 123-4567", "030 1234 5678", "4111 1111 1111 1111", "12", "2026", "555", "4567"},
			not:     []string{"12, in 2026"},
		},
		{
			name:    "no fragments of glued numbers",
			content: "hash 4f9a8b7c3d2e1f00 and v2 and abc123",
			want:    []string{"4f9a8b7c3d2e1f00"},
			not:     []string{"9", "8", "123", "2"},
		},
		{
			name:    "invalid iban stays chunks",
			content: "DE00 1234 5678 9012 3456 78 is not valid",
			want:    []string{"DE00", "1234 5678 9012 3456 78"},
			not:     []string{"DE00 1234 5678 9012 3456 78"},
		},
		{
			name:    "ipv6 and userinfo",
			content: "http://user:pw@[2001:db8::1]:8080/x and mailto:bob@mail.example.org",
			want:    []string{"2001:db8::1", "[2001:db8::1]:8080", "bob@mail.example.org", "mailto:bob@mail.example.org"},
		},
		{
			name:    "unicode words",
			content: "Überweisung an Zoë Müller — Straße 12",
			want:    []string{"Überweisung", "Müller", "Straße", "12"},
			not:     []string{"an", "Zoë"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Extract(c.content)
			checkExtract(t, c.content, got)
			for _, w := range c.want {
				if !slices.Contains(got, w) {
					t.Errorf("missing %q in %q", w, got)
				}
			}
			for _, w := range c.not {
				if slices.Contains(got, w) {
					t.Errorf("unexpected %q in %q", w, got)
				}
			}
		})
	}
}

func TestExtractLongContentIsNotAValue(t *testing.T) {
	long := strings.Repeat("word ", WholeMaxLen)
	for _, v := range Extract(long) {
		if len(v) > 10 {
			t.Fatalf("long content produced %q", trunc(v))
		}
	}
}

func TestExtractorReuse(t *testing.T) {
	var e Extractor
	a := e.Append(nil, "first alpha@example.com")
	b := e.Append(nil, "first alpha@example.com")
	if !slices.Equal(a, b) || len(a) == 0 {
		t.Fatalf("reused Extractor gave %q then %q", a, b)
	}
}

func TestExtractRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 2000 {
		c := randText(rng, `aZ09 .,:;/@-_=+'"()[]{}<>\`+"`", rng.IntN(200))
		checkExtract(t, c, Extract(c))
	}
	_, docs := benchSecrets(50)
	for _, d := range docs {
		checkExtract(t, d, Extract(d))
	}
}
