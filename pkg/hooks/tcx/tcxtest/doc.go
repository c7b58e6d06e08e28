// Package tcxtest builds the throwaway network the data path tests run
// on, and a queue listener to stand in for the verdict loop.
//
//	guest ns            router ns (plays the host)              world ns
//	g0 10.77.1.2  ----  r0 10.77.1.1 | r1 10.77.2.1  ----  w0 10.77.2.2
//	   fd77:1::2           fd77:1::1 |    fd77:2::1           fd77:2::2
//
// The TC program and carbd's netfilter rules go on r0 in the router
// namespace, so the machine's own firewall is never touched. Namespace
// names are unique per test and removed when the test ends, even when it
// fails. Interface names are fixed: they live inside the namespaces.
//
// # Requirements
//
// Linux, root, the ip tool (iproute2). Helpers skip the test when not
// root.
//
// # Tests
//
// It has none of its own: pkg/hooks/tcx and pkg/hooks/nfrules exercise it.
package tcxtest
