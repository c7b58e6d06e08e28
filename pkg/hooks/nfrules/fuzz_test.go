package nfrules

import (
	"strings"
	"testing"
)

// FuzzXtablesRemoval feeds arbitrary iptables-save text to the parsers
// behind Remove and Apply and checks that they only ever touch carbd's
// own chains and the rules that jump to them.
func FuzzXtablesRemoval(f *testing.F) {
	f.Add(hostSave)
	f.Add("*filter\n:CARBD-sb1-F - [0:0]\n-A FORWARD -i x -j CARBD-sb1-F\nCOMMIT\n")
	f.Add("*filter\n-A FORWARD -j\n-A\n-A X -g CARBD-sb1-I -j DROP\n*nat\n:CARBD-sb1-F - [0:0]\n")
	p, err := Build(sb1, BackendXtables)
	if err != nil {
		f.Fatal(err)
	}
	ours := map[string]bool{}
	for _, c := range p.ChainNames() {
		ours[c] = true
	}
	f.Fuzz(func(t *testing.T, save string) {
		out := XtablesRemoval(save, p.ChainNames())
		if out != "" {
			if !strings.HasPrefix(out, "*filter\n") || !strings.HasSuffix(out, "COMMIT\n") {
				t.Fatalf("malformed restore input:\n%s", out)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			for _, l := range lines[1 : len(lines)-1] {
				f := strings.Fields(l)
				switch {
				case len(f) == 2 && (f[0] == "-F" || f[0] == "-X"):
					if !ours[f[1]] {
						t.Fatalf("touches chain %q: %q", f[1], l)
					}
				case len(f) >= 4 && f[0] == "-D":
					if !jumpsToOurs(f, ours) || ours[f[1]] {
						t.Fatalf("deletes a rule that is not a jump to carbd: %q", l)
					}
					if !strings.Contains(save, "-A"+l[2:]) {
						t.Fatalf("deletes a rule the save does not have: %q", l)
					}
				default:
					t.Fatalf("unexpected line %q", l)
				}
			}
		}
		del, ins := p.JumpFixes(save)
		if len(del) > len(ins) || len(ins) > len(p.Jumps) {
			t.Fatalf("jump fixes: delete %v insert %v", del, ins)
		}
	})
}

func jumpsToOurs(f []string, ours map[string]bool) bool {
	for i := 2; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && ours[f[i+1]] {
			return true
		}
	}
	return false
}
