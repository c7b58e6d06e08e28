package daemon

import (
	"net/netip"

	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// masquerade routes the sandbox's egress through the host: the nfrules
// NAT plan (carbd-nat-<id> tables masquerading the sandbox's networks on
// every interface but its own; forwarding on while any sandbox needs it,
// put back by the last one). Who needs forwarding is counted machine-wide
// in nfrules.DefaultSysctlDir, whatever the sandbox's state directory:
// the sysctls belong to the host, not to a sandbox. It returns the undo.
// With interception, the guest's connections to the intercepted ports are
// redirected to the interceptor's listener.
func masquerade(p netns.Plan, ic *interceptor) (func() error, error) {
	cfg := nfrules.NATConfig{SandboxID: p.ID, Iface: p.HostIf,
		Subnets: []netip.Prefix{p.Subnet4(), p.Subnet6()}, Forwarding: true, StateDir: nfrules.DefaultSysctlDir}
	if ic != nil {
		cfg.RedirectPorts, cfg.RedirectTo = ic.ports(), ic.port
	}
	return nfrules.ApplyNAT(cfg)
}
