package daemon

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

// The run's summary stays readable whatever the run did: counts, the
// first entries of each list, then how many more.
func TestSummaryBounded(t *testing.T) {
	s := &Summary{ID: "sb", ExitCode: 0}
	for i := 0; i < 500; i++ {
		p := fmt.Sprintf("out/file-%03d.txt", i)
		ev := &decide.Event{Ch: decide.ChanFile, Dir: decide.Out, Op: "file:write", Obj: p}
		s.Released = append(s.Released, decide.Decision{Seq: uint64(i + 1), Verdict: decide.Release, Event: ev})
		s.Committed = append(s.Committed, p)
	}
	for i := 0; i < 30; i++ {
		ev := &decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: "http:POST", Obj: "https://x.example/" + strings.Repeat("a", 500)}
		s.Refused = append(s.Refused, decide.Decision{Seq: uint64(1000 + i), Verdict: decide.Refuse, Event: ev, Justification: strings.Repeat("why ", 200)})
	}
	var b bytes.Buffer
	s.WriteSummary(&b)
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) > 70 {
		t.Errorf("%d lines for 530 decisions and 500 files", len(lines))
	}
	for _, l := range lines {
		if len(l) > 1000 {
			t.Errorf("a line of %d characters: %.120s…", len(l), l)
		}
	}
	for _, want := range []string{"released 500, refused 30, held 0; files: committed 500", "and 480 more released", "and 10 more refused", "out/file-019.txt and 480 more"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}
