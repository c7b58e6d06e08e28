package decide

import (
	"context"
	"strings"
	"testing"
)

// Compressed or archived content hides what it carries from the value
// scan: after the agent read secret data, it is decided as opaque content
// (it may carry anything read so far); before, it is released as usual.
func TestPackedContentIsOpaque(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	ctx := context.Background()
	withHeaders := func(body string, hdr ...string) Event {
		ev := post("api.example.com", body)
		for i := 0; i+1 < len(hdr); i += 2 {
			ev.Fields = append(ev.Fields, Field{Name: "header." + hdr[i], Role: RoleControl, Value: hdr[i+1]})
		}
		return ev
	}
	cases := []struct {
		name   string
		ev     Event
		packed bool
	}{
		{"plain text", withHeaders("the weekly report"), false},
		{"identity encoding", withHeaders("report", "content-encoding", "identity"), false},
		{"gzip encoding", withHeaders("\x1f\x8b\x08\x00zz", "content-encoding", "gzip"), true},
		{"gzip magic, no header", withHeaders("\x1f\x8b\x08\x00zz"), true},
		{"zip upload", withHeaders("PK\x03\x04....", "content-type", "application/zip"), true},
		{"git push", withHeaders("0094old new refs/heads/main\x00 report-status0000PACK\x00\x00\x00\x02\x00\x00\x00\x03xx", "content-type", "application/x-git-receive-pack-request"), true},
		{"git pack without the type", withHeaders("0000PACK\x00\x00\x00\x02\x00\x00\x00\x01"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := packedContent(&tc.ev); got != tc.packed {
				t.Fatalf("packedContent = %v, want %v", got, tc.packed)
			}
			e := New(p, Options{})
			e.Task("post the report to api.example.com")
			if d := e.Propose(ctx, tc.ev).Decision; d.Verdict != Release {
				t.Errorf("before any secret read: %v %s", d.Verdict, d.Justification)
			}
			e.Observe(Event{Ch: ChanFile, Dir: In, Obj: "secrets/token", Content: "tok_9f8e7d6c5b4a39281"})
			d := e.Propose(ctx, tc.ev).Decision
			if tc.packed && (d.Verdict == Release || d.Reason.Code != CodeUncleared || !strings.Contains(d.Justification, "compressed or archived")) {
				t.Errorf("after a secret read: %v %s %s", d.Verdict, d.Reason.Code, d.Justification)
			}
			if !tc.packed && d.Verdict != Release {
				t.Errorf("plain content after a secret read: %v %s", d.Verdict, d.Justification)
			}
		})
	}
}

func FuzzPackedContent(f *testing.F) {
	f.Add("PACK\x00\x00\x00\x02", "application/x-git-receive-pack-request", "gzip")
	f.Add("hello", "text/plain", "")
	f.Fuzz(func(t *testing.T, body, ctype, enc string) {
		ev := Event{Ch: ChanNet, Dir: Out, Op: "http:POST", Content: body,
			Fields: []Field{{Name: "header.content-type", Value: ctype}, {Name: "header.content-encoding", Value: enc}}}
		_ = packedContent(&ev)
	})
}
