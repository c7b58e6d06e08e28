package daemon

import (
	"slices"
	"testing"
)

// The intercepted ports: the configured ones (default 443) and the
// policy's, sorted, once each.
func TestInterceptPorts(t *testing.T) {
	for _, tt := range []struct {
		cfg, policy, want []uint16
	}{
		{nil, nil, []uint16{443}},
		{nil, []uint16{8443}, []uint16{443, 8443}},
		{[]uint16{9443}, []uint16{8443, 9443}, []uint16{8443, 9443}},
		{[]uint16{443, 8443}, []uint16{853, 8443}, []uint16{443, 853, 8443}},
	} {
		if got := interceptPorts(tt.cfg, tt.policy); !slices.Equal(got, tt.want) {
			t.Errorf("interceptPorts(%v, %v) = %v, want %v", tt.cfg, tt.policy, got, tt.want)
		}
	}
}
