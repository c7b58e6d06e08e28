package tcx

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func key(proto uint8, src, dst string, sport, dport uint16) FlowKey {
	return FlowKey{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: sport, DstPort: dport, Proto: proto}
}

func TestFlowKeyRaw(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    FlowKey
		want RawFlowKey
		back FlowKey // what converting back gives, when not k
	}{
		{
			name: "tcp4",
			k:    key(ProtoTCP, "10.0.0.2", "192.0.2.1", 40000, 80),
			want: RawFlowKey{Family: 4, Proto: 6, SrcPort: 40000, DstPort: 80,
				Src: [16]byte{10, 0, 0, 2}, Dst: [16]byte{192, 0, 2, 1}},
		},
		{
			name: "udp6",
			k:    key(ProtoUDP, "fd00::2", "2001:db8::1", 5353, 53),
			want: RawFlowKey{Family: 6, Proto: 17, SrcPort: 5353, DstPort: 53,
				Src: netip.MustParseAddr("fd00::2").As16(), Dst: netip.MustParseAddr("2001:db8::1").As16()},
		},
		{
			name: "mapped-v4-is-v4",
			k:    key(ProtoUDP, "::ffff:10.0.0.2", "::ffff:192.0.2.1", 1, 2),
			want: RawFlowKey{Family: 4, Proto: 17, SrcPort: 1, DstPort: 2,
				Src: [16]byte{10, 0, 0, 2}, Dst: [16]byte{192, 0, 2, 1}},
			back: key(ProtoUDP, "10.0.0.2", "192.0.2.1", 1, 2),
		},
		{
			name: "icmp-echo",
			k:    ICMPEchoKey(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("192.0.2.1"), 0x1234),
			want: RawFlowKey{Family: 4, Proto: 1, SrcPort: 0x1234, DstPort: 8 << 8,
				Src: [16]byte{10, 0, 0, 2}, Dst: [16]byte{192, 0, 2, 1}},
		},
		{
			name: "icmpv6-echo",
			k:    ICMPEchoKey(netip.MustParseAddr("fd00::2"), netip.MustParseAddr("2001:db8::1"), 7),
			want: RawFlowKey{Family: 6, Proto: 58, SrcPort: 7, DstPort: 128 << 8,
				Src: netip.MustParseAddr("fd00::2").As16(), Dst: netip.MustParseAddr("2001:db8::1").As16()},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := tc.k.Raw()
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, raw); d != "" {
				t.Errorf("raw (-want +got):\n%s", d)
			}
			back, err := raw.FlowKey()
			if err != nil {
				t.Fatal(err)
			}
			want := tc.back
			if !want.Src.IsValid() {
				want = tc.k
			}
			if back != want {
				t.Errorf("back %v, want %v", back, want)
			}
		})
	}
}

func TestFlowKeyInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    FlowKey
		want string
	}{
		{"no-src", FlowKey{Dst: netip.MustParseAddr("10.0.0.1"), Proto: 6}, "missing address"},
		{"mixed", key(ProtoTCP, "10.0.0.2", "2001:db8::1", 1, 2), "different families"},
		{"zone", FlowKey{Src: netip.MustParseAddr("fe80::1%eth0"), Dst: netip.MustParseAddr("fe80::2"), Proto: 6}, "zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.k.Raw()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "tcx: ") {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	if _, err := (RawFlowKey{Family: 5}).FlowKey(); err == nil {
		t.Error("family 5 converted without error")
	}
}

func TestReasons(t *testing.T) {
	for r := Reason(0); r < NumReasons; r++ {
		name := r.String()
		prefix, _, _ := strings.Cut(name, "-")
		if want := map[Outcome]string{Passed: "pass", Queued: "queue", Dropped: "drop"}[r.Outcome()]; prefix != want {
			t.Errorf("reason %d %q has outcome %s", r, name, r.Outcome())
		}
	}
	var c Counters
	c[PassFast] = Count{1, 100}
	c[QueueDNS] = Count{2, 200}
	c[QueueFragment] = Count{3, 300}
	c[DropNoDaemon] = Count{4, 400}
	if got := c.Total(Queued); got != (Count{5, 500}) {
		t.Errorf("queued total %+v", got)
	}
	if got := c.Sub(c); got != (Counters{}) {
		t.Errorf("c - c = %+v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"ok", Config{SandboxID: "sb-1", Ifname: "tap0"}, ""},
		{"no id", Config{Ifname: "tap0"}, "sandbox id"},
		{"slash", Config{SandboxID: "a/b", Ifname: "tap0"}, "character '/'"},
		{"dots", Config{SandboxID: "..", Ifname: "tap0"}, "character '.'"},
		{"no iface", Config{SandboxID: "a"}, "Ifname or Ifindex"},
		{"relative pin dir", Config{SandboxID: "a", Ifindex: 3, PinDir: "bpf"}, "not absolute"},
		{"mode", Config{SandboxID: "a", Ifindex: 3, Mode: 7}, "unknown mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "tcx: ") {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}
