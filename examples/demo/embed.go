// Package demofiles embeds the demo's policy and scripted agent, so
// `carbd demo` runs from the binary alone.
package demofiles

import _ "embed"

// Policy is examples/demo/policy.yaml.
//
//go:embed policy.yaml
var Policy []byte

// Agent is examples/demo/agent.sh, the scripted agent.
//
//go:embed agent.sh
var Agent []byte
