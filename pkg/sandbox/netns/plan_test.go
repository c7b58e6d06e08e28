package netns

import (
	"net/netip"
	"testing"
)

func TestNewPlan(t *testing.T) {
	p, err := NewPlan("demo-1", 5)
	if err != nil {
		t.Fatal(err)
	}
	want := Plan{ID: "demo-1", Index: 5, HostIf: "cbh-demo-1", GuestIf: "cbg-demo-1",
		HostAddr4: netip.MustParsePrefix("10.200.0.21/30"), GuestAddr4: netip.MustParsePrefix("10.200.0.22/30"),
		HostAddr6: netip.MustParsePrefix("fd00:cb:0:5::1/64"), GuestAddr6: netip.MustParsePrefix("fd00:cb:0:5::2/64"),
		Queue: QueueBase + 5}
	if p != want {
		t.Errorf("plan\n got %+v\nwant %+v", p, want)
	}
	if p.Subnet4() != netip.MustParsePrefix("10.200.0.20/30") || p.Subnet6() != netip.MustParsePrefix("fd00:cb:0:5::/64") {
		t.Errorf("subnets %v %v", p.Subnet4(), p.Subnet6())
	}
	last, err := NewPlan("x", MaxIndex)
	if err != nil || last.Queue != 65535 || last.GuestAddr4 != netip.MustParsePrefix("10.200.255.254/30") {
		t.Errorf("last plan %+v %v", last, err)
	}
	// Distinct indexes never share an address, an interface or a queue.
	seen := map[netip.Addr]bool{}
	for i := 0; i <= MaxIndex; i += 97 {
		q, _ := NewPlan("s", i)
		for _, a := range []netip.Addr{q.HostAddr4.Addr(), q.GuestAddr4.Addr(), q.HostAddr6.Addr(), q.GuestAddr6.Addr()} {
			if seen[a] {
				t.Fatalf("address %v reused at index %d", a, i)
			}
			seen[a] = true
		}
	}
	for _, bad := range []struct {
		id  string
		idx int
	}{{"", 0}, {"UPPER", 0}, {"much-too-long-id", 0}, {"-x", 0}, {"ok", -1}, {"ok", MaxIndex + 1}} {
		if _, err := NewPlan(bad.id, bad.idx); err == nil {
			t.Errorf("NewPlan(%q, %d) accepted", bad.id, bad.idx)
		}
	}
}
