// Package netnsx runs a function inside a network namespace without ever
// handing an OS thread back to the Go scheduler in the wrong namespace.
//
// # Why
//
// A network namespace belongs to an OS thread, not to a goroutine. The
// usual pattern (lock the thread, setns into the target, run, setns back,
// unlock) returns the thread to the pool still inside the target whenever
// the switch back fails or is skipped, and any goroutine scheduled on it
// afterwards opens its sockets in the sandbox's namespace.
//
// # Contract
//
// Do runs fn on a fresh goroutine locked to its OS thread, so the caller's
// thread never changes namespace. After fn the thread switches back and
// checks (by the namespace's device and inode) that it is where it
// started; only then is it unlocked. If switching back fails, or fn
// panics or calls runtime.Goexit, the thread stays locked and the runtime
// terminates it when the goroutine ends (runtime.LockOSThread's documented
// behaviour since Go 1.10). On the process's main thread the runtime
// cannot end the thread; it parks it for good instead, so it still never
// runs another goroutine, but /proc/self/net then shows that namespace:
// read /proc/thread-self/net inside Do.
//
// fn may open sockets (they stay in the namespace) and start processes
// (they inherit it). It must not start goroutines that expect to run in
// the namespace: those run on other threads.
//
// # Needs
//
// CAP_SYS_ADMIN for setns(2). Tested as root with real namespaces; the
// failing switch back is tested through an injected setns.
package netnsx
