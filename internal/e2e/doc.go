// Package e2e holds the end-to-end tests with a real agent CLI: `make e2e`
// installs the agent from npm and runs them (build tag e2e) as root. The
// scripted model server they talk to is in modelsrv.
package e2e
