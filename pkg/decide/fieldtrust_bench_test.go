package decide

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkObserveFieldTrust measures what field-level trust adds to
// observing a structured tool result: a list of 40 file records (about
// 20 KiB, like AgentDojo's list_files) observed by an engine whose policy
// has no field rule for the source (baseline) and one with a rule that
// parses the output and selects the id of each named file (fields).
//
// Run: go test -run '^$' -bench ObserveFieldTrust -count 5 ./pkg/decide
func BenchmarkObserveFieldTrust(b *testing.B) {
	var out strings.Builder
	for i := range 40 {
		fmt.Fprintf(&out, "- content: \"Notes of meeting %d. %s\"\n  filename: file-%d.docx\n  id_: '%d'\n  owner: emma@own-example.com\n  size: %d\n",
			i, strings.Repeat("Agenda, decisions and action items for the team. ", 8), i, i, 400+i)
	}
	ev := Event{Ch: ChanNet, Dir: In, Obj: "tool:list_files", Op: "tool:list_files", Source: "list_files()", Content: out.String()}
	const pol = `
version: 1
levels: [public, private]
sensitive:
  - {name: files, level: private, objects: ["tool:list_files"]}
fields:
  - name: named-file-ids
    objects: ["tool:%s"]
    path: id_
    where: {filename: trusted}
    trust: trusted
    reason: ids the drive assigns to a file the user named
`
	for _, c := range []struct{ name, tool string }{{"baseline", "other_tool"}, {"fields", "list_files"}} {
		b.Run(c.name, func(b *testing.B) {
			p, err := ParsePolicy("bench.yaml", []byte(fmt.Sprintf(pol, c.tool)))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(ev.Content)))
			b.ReportAllocs()
			for b.Loop() {
				e := New(p, Options{})
				e.Task("Delete file-7.docx and file-23.docx")
				e.Observe(ev)
			}
		})
	}
}
