package match

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Synthetic but realistic test data: "secret" documents (customer
// records, credentials, notes) whose extracted values are the sensitive
// tokens, and effect bodies of mixed text (prose, JSON, logs, URLs, base64)
// in which a few of those tokens may be planted.

var syllables = strings.Fields(`al an ar ber ca chen da de el en er fa gen hal in ka ko la lin ma mer
	na ne or os pa ra ri sen son ta ter to va vor wal zyk bri cor dun eth fol gar hes isk jor kel lum
	mon nor oth pel quin ros sel tun ul ven wen yor zan str tha ple mic`)

// common is prose vocabulary: frequent English words, short and long.
var common = strings.Fields(`the of and to in is was for that on with as by at from this be are it
	an or which have has not but were their all can more one will also been other new some into only
	time about than its over such after first most these two may year years would when they there
	people information development government international management university through
	between important following community including available different national business
	research services experience industry particular information performance education
	technology environment understanding organization application customer payment account
	report quarterly meeting schedule attached please review update request response server
	deployment configuration database network security password transfer invoice document
	summary project analysis result results number amount balance statement reference`)

func pseudoWord(rng *rand.Rand, syl int) string {
	var b strings.Builder
	for range syl {
		b.WriteString(syllables[rng.IntN(len(syllables))])
	}
	return b.String()
}

func capital(s string) string { return strings.ToUpper(s[:1]) + s[1:] }

const base62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func randFrom(rng *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// makeIBAN returns a valid IBAN for country cc with n digits of BBAN,
// printed in groups of four.
func makeIBAN(rng *rand.Rand, cc string, n int) string {
	bban := randFrom(rng, "0123456789", n)
	rem := 0
	for _, c := range bban + cc + "00" {
		if c >= 'A' {
			rem = (rem*100 + int(c-'A'+10)) % 97
		} else {
			rem = (rem*10 + int(c-'0')) % 97
		}
	}
	raw := fmt.Sprintf("%s%02d%s", cc, 98-rem, bban)
	var b strings.Builder
	for i := 0; i < len(raw); i += 4 {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(raw[i:min(i+4, len(raw))])
	}
	return b.String()
}

// secretDoc returns one synthetic sensitive document.
func secretDoc(rng *rand.Rand, i int) string {
	first, last := capital(pseudoWord(rng, 2)), capital(pseudoWord(rng, 3))
	company := pseudoWord(rng, 3) + []string{"-logistics", "-capital", "", "-systems"}[rng.IntN(4)]
	tld := []string{"de", "com", "io", "co.uk", "fr"}[rng.IntN(5)]
	var notes []string
	for range 6 + rng.IntN(6) {
		if rng.IntN(3) == 0 {
			notes = append(notes, pseudoWord(rng, 3+rng.IntN(2)))
		} else if w := common[rng.IntN(len(common))]; len(w) < MinTokenLen {
			// Long common words would be tokens that every prose
			// effect contains; docs/provenance.md discusses them.
			notes = append(notes, w)
		}
	}
	return fmt.Sprintf(`Client record %d
Name: %s %s
Email: %s.%s@%s.%s
IBAN: %s
Phone: +49 %d %04d %04d
API key: sk_live_%s
AWS_SECRET_ACCESS_KEY=%s
Passcode: "%s%d!"
Notes: %s
`, 100000+i, first, last, strings.ToLower(first), strings.ToLower(last), company, tld,
		makeIBAN(rng, []string{"DE", "FR", "GB", "NL"}[rng.IntN(4)], 18),
		30+rng.IntN(60), rng.IntN(10000), rng.IntN(10000),
		randFrom(rng, base62, 24), randFrom(rng, base62+"/+", 40),
		capital(pseudoWord(rng, 2)), rng.IntN(1000), strings.Join(notes, " "))
}

// benchSecrets returns n distinct tokens extracted from secret documents
// (each at least MinTokenLen bytes after Norm), and the documents.
func benchSecrets(n int) (toks []string, docs []string) {
	rng := rand.New(rand.NewPCG(42, 7))
	seen := map[string]bool{}
	var e Extractor
	for i := 0; len(toks) < n; i++ {
		d := secretDoc(rng, i)
		docs = append(docs, d)
		for _, v := range e.Append(nil, d) {
			if nv := Norm(v); len(nv) >= MinTokenLen && !seen[nv] && len(toks) < n {
				seen[nv] = true
				toks = append(toks, v)
			}
		}
	}
	return toks, docs
}

// benchBody returns about size bytes of mixed effect content: prose,
// JSON, log lines, URLs and base64, with the given tokens planted (in
// their original spelling) at random places.
func benchBody(size int, plant []string) string {
	rng := rand.New(rand.NewPCG(9, 9))
	var b strings.Builder
	b.Grow(size + 4096)
	for b.Len() < size {
		switch rng.IntN(10) {
		case 0, 1, 2, 3, 4: // a paragraph of prose
			for k := range 20 + rng.IntN(40) {
				w := common[rng.IntN(len(common))]
				if k == 0 {
					w = capital(w)
				}
				b.WriteString(w)
				if rng.IntN(12) == 0 {
					b.WriteString(". ")
				} else {
					b.WriteByte(' ')
				}
			}
			b.WriteString("\n\n")
		case 5, 6: // JSON
			fmt.Fprintf(&b, `{"id": %d, "status": "ok", "amount": "%d.%02d", "customer": "%s", "updated_at": "2026-%02d-%02dT%02d:%02d:00Z", "tags": ["%s", "%s"]}`+"\n",
				rng.IntN(1e9), rng.IntN(1e5), rng.IntN(100), common[rng.IntN(len(common))], 1+rng.IntN(12), 1+rng.IntN(28), rng.IntN(24), rng.IntN(60),
				common[rng.IntN(len(common))], common[rng.IntN(len(common))])
		case 7: // log lines
			fmt.Fprintf(&b, "2026-11-29 %02d:%02d:%02d INFO request_id=%s method=POST path=/api/v2/%s status=%d duration_ms=%d\n",
				rng.IntN(24), rng.IntN(60), rng.IntN(60), randFrom(rng, "0123456789abcdef", 32), common[rng.IntN(len(common))], 200+rng.IntN(300), rng.IntN(2000))
		case 8: // URLs
			fmt.Fprintf(&b, "See https://docs.%s.example.com/%s/%s?page=%d for details.\n",
				common[rng.IntN(len(common))], common[rng.IntN(len(common))], common[rng.IntN(len(common))], rng.IntN(100))
		case 9: // base64 attachment
			for range 1 + rng.IntN(4) {
				b.WriteString(randFrom(rng, base62+"+/", 76))
				b.WriteByte('\n')
			}
		}
	}
	s := b.String()[:size]
	for _, p := range plant {
		at := rng.IntN(len(s) - len(p))
		for at > 0 && s[at-1] != ' ' && s[at-1] != '\n' {
			at--
		}
		s = s[:at] + p + " " + s[at:]
	}
	return s
}

// benchData returns nTok tokens and a body of size bytes with hits of
// them planted.
func benchData(nTok, size, hits int) ([]string, string) {
	toks, _ := benchSecrets(nTok)
	var plant []string
	for i := range hits {
		plant = append(plant, toks[(i*7919)%len(toks)])
	}
	return toks, benchBody(size, plant)
}
