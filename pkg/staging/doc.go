// Package staging is the file channel's write staging: the overlay layers
// of the mediated working directory, the write-ahead journal with
// pre-images, commit, abort, crash recovery and the persisted labels.
//
// # Layers
//
// W is the principal's working directory; only Commit changes it. B, the
// overlay's lower layer, is a hard-link farm of W made afresh when each
// run starts (directories recreated, files hard-linked, symlinks copied)
// and never changed during the run: commits replace W's directory
// entries (new inodes renamed into place) and never write into an
// existing inode. U is the upper layer and M = overlay(B, U) the merged
// view exported to the guest (virtiofsd) or bind-mounted into a
// namespace sandbox. The layers and the journal live in the layer
// directory, on W's mount; the labels, the lock and the conflicts in the
// state directory, which outlives runs and reboots. Plan computes all of
// this as data; Mount and Unmount are the only mount syscalls.
//
// # Runs and conflicts
//
// Open builds the base from W as it is (or resumes the layers of a run
// that did not Finish) and stamps every entry (inode, size, mtime,
// ctime). A staged change is committed only while W's entry still has
// the stamp of the agent's view; otherwise it is a Conflict: not
// committed, the user's version stays in W, the agent's is kept under
// the state directory's conflicts/<run>.
//
// # The record of what is staged
//
// U itself is the record: Scan walks it and compares every entry with W
// (a stamp of the upper inode's ctime skips content already committed),
// reporting each difference as a Change: created or written files,
// removals (whiteouts, opaque directories, and carbd-created entries U
// lost), directories, modes, user.* xattrs, symlinks, and refused
// entries (device nodes, escaping symlinks, oversized files, too deep or
// too long paths). A Change carries a digest of the staged entry; Commit
// and Event check it, so what is committed is exactly what was decided.
//
// # Commit, abort, recovery
//
// Commit writes a journal in the state directory (new images copied from
// U, pre-images hard-linked from W, the new label index), syncs it, marks
// it applying, then renames, unlinks and creates entries in W and marks
// it done. Open recovers an interrupted commit: not applying, discarded;
// applying, rolled back from the pre-images; done, finished. Abort
// reverts changes through M, so overlayfs sees only its own writes.
// Every path in W, U, B and M is resolved with openat2 beneath a
// directory descriptor, never following a symlink or crossing a mount.
// See docs/staging.md for the design, its costs and its limits.
//
// # Requirements
//
// Linux and root (mount, trusted.* overlay xattrs, chown). The layer
// directory must be on W's mount. The plan and the journal, index,
// pending and seen encodings are pure and test anywhere.
//
// # Tests
//
// Plan, encodings (with fuzz targets FuzzJournal, FuzzIndex, FuzzPending and FuzzSeen) and path
// logic run without root. The rest mounts real overlays in temporary
// directories as root: every operation class through M, a seeded
// property test and a fuzz target (FuzzOperations) comparing W and M with
// in-memory models across random commits, aborts and restarts, crash
// injection (the commit and the recovery run in a re-executed test binary
// that SIGKILLs itself at every journal step), and the hostile-input
// cases, and a model-based test of many runs on one W with the user
// editing it between and during runs (TestManyRunsUserEdits). Benchmarks
// (also BenchmarkOpenBase and BenchmarkNextRun): BenchmarkFileCycle, BenchmarkCommit, BenchmarkScan
// (CARBD_BENCH_SCAN_FILES sets the file count).
package staging
