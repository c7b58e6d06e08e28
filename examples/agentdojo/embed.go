// Package agentdojopolicies embeds the example AgentDojo suite policies
// (<suite>.yaml), so `carbd eval agentdojo` and `carbd calib agentdojo`
// run from the binary alone, from any directory, when no --policies is
// given.
package agentdojopolicies

import "embed"

// Name names the embedded policies in messages and reports, as the
// repository path they come from.
const Name = "examples/agentdojo"

// FS holds banking.yaml, slack.yaml, travel.yaml and workspace.yaml.
//
//go:embed *.yaml
var FS embed.FS
