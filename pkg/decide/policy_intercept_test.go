package decide_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
)

func TestPolicyIntercept(t *testing.T) {
	pol, err := decide.LoadPolicy(filepath.Join("testdata", "policy", "valid-intercept.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := decide.InterceptPolicy{Ports: []uint16{8443, 9443}, Pass: policyGlobs("updates.example.com", "*.pinned.example"),
		OnRefusedCA: decide.RefusedCAPass}
	if d := cmp.Diff(want, pol.Intercept, policyCmp...); d != "" {
		t.Errorf("intercept section (-want +got):\n%s", d)
	}
	for sni, pass := range map[string]bool{
		"updates.example.com": true, "UPDATES.example.com.": true, "a.pinned.example": true, "pinned.example": false,
		"x.updates.example.com": false, "api.example.com": false, "": false,
	} {
		if got := pol.Intercept.Passes(sni); got != pass {
			t.Errorf("Passes(%q) = %v, want %v", sni, got, pass)
		}
	}
	if s := pol.Summary(); !strings.Contains(s, "  intercept   tcp 443,8443,9443; 2 server names passed opaque: updates.example.com, *.pinned.example; a client refusing carbd's CA: pass\n") {
		t.Errorf("summary without the intercept line:\n%s", s)
	}
	// The canonical form keeps the section.
	out, err := pol.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "intercept:\n  ports: [8443, 9443]\n  pass: [updates.example.com, '*.pinned.example']\n  on_refused_ca: pass\n") {
		t.Errorf("canonical form:\n%s", out)
	}
	again, err := decide.ParsePolicy(pol.Name, out)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(pol, again, policyCmp...); d != "" {
		t.Errorf("round trip (-first +second):\n%s", d)
	}
}

func TestPolicyInterceptDefault(t *testing.T) {
	for _, y := range []string{"", "intercept:\n", "intercept: {}\n", "intercept: {ports: [], pass: [], on_refused_ca: close}\n"} {
		pol, err := decide.ParsePolicy("t.yaml", []byte("version: 1\nlevels: [public]\n"+y))
		if err != nil {
			t.Fatalf("%q: %v", y, err)
		}
		if d := cmp.Diff(decide.InterceptPolicy{}, pol.Intercept, policyCmp...); d != "" {
			t.Errorf("%q: (-want +got):\n%s", y, d)
		}
		if pol.Intercept.Passes("api.example.com") {
			t.Errorf("%q: a party passes by default", y)
		}
		out, err := pol.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "intercept") || strings.Contains(pol.Summary(), "intercept") {
			t.Errorf("%q: the default section is written out:\n%s", y, out)
		}
	}
}

func TestPolicyInterceptErrors(t *testing.T) {
	_, err := decide.LoadPolicy(filepath.Join("testdata", "policy", "invalid-intercept.yaml"))
	if !errors.Is(err, decide.ErrInvalidPolicy) {
		t.Fatalf("err = %v, want an invalid policy", err)
	}
	f := filepath.Join("testdata", "policy", "invalid-intercept.yaml")
	want := []string{
		f + `:4:11: intercept.ports[0]: port 443 is always intercepted; list only the other TLS ports`,
		f + `:4:22: intercept.ports[2]: port 8443 is already listed at line 4`,
		f + `:4:28: intercept.ports[3]: port 53 is DNS (carbd's resolver answers the sandbox over it), not TLS`,
		f + `:4:32: intercept.ports[4]: port 80 is plain HTTP, decided request by request without interception`,
		f + `:4:36: intercept.ports[5]: port 0 is out of range 1..65535`,
		f + `:4:39: intercept.ports[6]: ` + portTypeMsg(t),
		f + `:5:10: intercept.pass[0]: "10.0.0.1" is an address; list addresses under cidrs`,
		f + `:5:22: intercept.pass[1]: "https://a.example" is a URL; write the host name only`,
		f + `:5:43: intercept.pass[2]: "a.example:443" has a port; list ports under ports`,
		f + `:5:60: intercept.pass[3]: empty host glob`,
		f + `:6:18: intercept.on_refused_ca: unknown value "allow" (want close or pass)`,
		f + `:7:3: intercept.passes: unknown field (did you mean "pass"?)`,
	}
	if d := cmp.Diff(want, strings.Split(err.Error(), "\n")); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}
}

// portTypeMsg is the parser's message for a string where a port belongs.
func portTypeMsg(t *testing.T) string {
	t.Helper()
	_, err := decide.ParsePolicy("t.yaml", []byte("version: 1\nlevels: [public]\nparties:\n  - {name: a, hosts: [a], ports: [\"x\"], clearance: public}\n"))
	if err == nil {
		t.Fatal("a string port parsed")
	}
	_, msg, _ := strings.Cut(err.Error(), "ports[0]: ")
	return msg
}
