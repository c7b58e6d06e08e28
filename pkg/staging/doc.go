// Package staging is the file channel's write staging: the overlay layers
// of the mediated working directory, the write-ahead journal with
// pre-images, commit, abort and crash recovery.
//
// # Requirements
//
// Linux and root for the mount; the plan (directories, mount options) is
// built by pure code and tests anywhere.
package staging
