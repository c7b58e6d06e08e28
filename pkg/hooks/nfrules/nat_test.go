package nfrules

import (
	"net/netip"
	"strings"
	"testing"
)

var natSB1 = NATConfig{SandboxID: "sb1", Iface: "tap-sb1", Forwarding: true, StateDir: "/run/carbd",
	Subnets: []netip.Prefix{netip.MustParsePrefix("10.200.0.20/30"), netip.MustParsePrefix("fd00:cb:0:5::/64")}}

func TestNATPlanGolden(t *testing.T) {
	p, err := BuildNAT(natSB1)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nat.golden", p.String())
	cfg := natSB1
	cfg.Forwarding = false
	cfg.Subnets = []netip.Prefix{netip.MustParsePrefix("10.200.0.22/30")} // masked
	p, err = BuildNAT(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nat-v4-noforward.golden", p.String())
	cfg = natSB1
	cfg.RedirectPorts, cfg.RedirectTo = []uint16{443, 8443}, 40123
	p, err = BuildNAT(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nat-redirect.golden", p.String())
}

func TestNATValidate(t *testing.T) {
	v4 := netip.MustParsePrefix("10.0.0.0/30")
	for _, tc := range []struct {
		name string
		cfg  NATConfig
		want string
	}{
		{"no id", NATConfig{Iface: "t", Subnets: []netip.Prefix{v4}}, "sandbox id"},
		{"bad iface", NATConfig{SandboxID: "a", Iface: "a b", Subnets: []netip.Prefix{v4}}, "interface name"},
		{"no subnet", NATConfig{SandboxID: "a", Iface: "t"}, "no subnet"},
		{"invalid subnet", NATConfig{SandboxID: "a", Iface: "t", Subnets: []netip.Prefix{{}}}, "invalid subnet"},
		{"two v4", NATConfig{SandboxID: "a", Iface: "t", Subnets: []netip.Prefix{v4, v4}}, "two ip subnets"},
		{"forwarding without state", NATConfig{SandboxID: "a", Iface: "t", Subnets: []netip.Prefix{v4}, Forwarding: true}, "state directory"},
		{"redirect without target", NATConfig{SandboxID: "a", Iface: "t", Subnets: []netip.Prefix{v4}, RedirectPorts: []uint16{443}}, "both ports and a target"},
		{"redirect to itself", NATConfig{SandboxID: "a", Iface: "t", Subnets: []netip.Prefix{v4}, RedirectPorts: []uint16{443}, RedirectTo: 443}, "cannot redirect port 443"},
	} {
		_, err := BuildNAT(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "nfrules: ") {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}
