package staging

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/carbd/carbd/pkg/decide"
)

// Op classifies a staged change relative to W.
type Op uint8

const (
	OpCreate  Op = iota + 1 // a regular file where W has none (or has another type)
	OpWrite                 // new content for a regular file of W
	OpUnlink                // a non-directory of W removed
	OpRmdir                 // a directory of W removed, with everything below it
	OpMkdir                 // a directory where W has none (or has another type)
	OpChmod                 // new permission bits, same content
	OpXattr                 // new user.* extended attributes, same content and mode
	OpSymlink               // a symbolic link where W has none or a different one
	OpMknod                 // a device node, FIFO or socket: always refused
)

var opNames = [...]string{OpCreate: "create", OpWrite: "write", OpUnlink: "unlink", OpRmdir: "rmdir",
	OpMkdir: "mkdir", OpChmod: "chmod", OpXattr: "setxattr", OpSymlink: "symlink", OpMknod: "mknod"}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// EventOp is the operation name of the change's decide.Event. A created
// file is a "file:write" like any other write (Kairos: file writes and
// unlinks are stageable); Change.Prev tells them apart.
func (o Op) EventOp() string {
	if o == OpCreate {
		return "file:write"
	}
	return "file:" + o.String()
}

// Type is the type of a file system entry.
type Type uint8

const (
	TypeNone    Type = iota // absent
	TypeFile                // regular file
	TypeDir                 // directory
	TypeSymlink             // symbolic link
	TypeSpecial             // device node, FIFO or socket
)

var typeNames = [...]string{TypeNone: "none", TypeFile: "file", TypeDir: "dir", TypeSymlink: "symlink", TypeSpecial: "special"}

func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Change is one staged difference between the merged view M and W, as
// Scan finds it in the upper layer. Changes are values; Commit and Abort
// take them back and check that the staged entry still has Digest, so
// what is committed is exactly what was scanned (and decided).
type Change struct {
	Op     Op
	Path   string      // relative to W, '/'-separated, byte-exact (any bytes but NUL)
	Type   Type        // the staged entry's type; TypeNone for unlink and rmdir
	Prev   Type        // W's entry at Path when scanned; TypeNone: absent
	Mode   fs.FileMode // permission bits as they will be committed (set-id and sticky bits removed)
	Size   int64       // staged file size
	Target string      // symlink target
	// Digest identifies the staged entry: type, raw mode, user.* xattrs,
	// symlink target and content (SHA-256). Zero when Refused is set.
	Digest [32]byte
	// Stripped is set when the staged mode carried setuid, setgid or
	// sticky bits; they are removed on commit.
	Stripped bool
	// Refused is non-empty when the change can never be committed: why.
	Refused string
}

func (c Change) String() string {
	s := c.Op.String() + " " + fmt.Sprintf("%q", c.Path)
	if c.Refused != "" {
		s += " (refused: " + c.Refused + ")"
	}
	return s
}

// Event is the change as an outgoing effect on the file channel, without
// its content (Stager.Event adds the content): Obj and the "path" field
// (role target) are the path relative to W. A symlink's target is a
// second target field; a chmod, a new directory, a created or written
// file carry the mode as committed as the control field "mode".
func (c Change) Event() decide.Event {
	ev := decide.Event{
		Ch:   decide.ChanFile,
		Dir:  decide.Out,
		Obj:  c.Path,
		Op:   c.Op.EventOp(),
		Kind: decide.Stageable,
		Fields: []decide.Field{
			{Name: "path", Role: decide.RoleTarget, Value: c.Path},
		},
	}
	switch c.Op {
	case OpSymlink:
		ev.Fields = append(ev.Fields, decide.Field{Name: "link", Role: decide.RoleTarget, Value: c.Target})
		ev.Content = c.Target
	case OpChmod, OpMkdir, OpCreate, OpWrite:
		// As the traced file:create and file:chmod events name it, so
		// one policy rule matches a planted executable either way.
		ev.Fields = append(ev.Fields, decide.Field{Name: "mode", Role: decide.RoleControl, Value: ModeString(c.Mode)})
	}
	return ev
}

// ModeString is a mode's permission bits as the file events show them:
// octal with a leading 0 ("0755").
func ModeString(m fs.FileMode) string {
	return "0" + strconv.FormatUint(uint64(m.Perm()), 8)
}

// Refusal is a staged change Commit or Abort did not apply, and why.
type Refusal struct {
	Path   string
	Op     Op
	Reason string
}

func (r Refusal) String() string { return fmt.Sprintf("%s %q: %s", r.Op, r.Path, r.Reason) }

// Result is what Commit or Abort did.
type Result struct {
	Applied  int       // changes applied
	Bytes    int64     // file content bytes written
	Refused  []Refusal // changes not applied, with the reason
	Stripped []string  // paths committed with set-id or sticky bits removed
	// Conflicts are changes not committed because W's entry is no longer
	// the one the agent's view had; they stay staged, and the agent's
	// version is kept (Conflict.Kept).
	Conflicts []Conflict
}

// Refusal reasons (prefixes of Refusal.Reason).
const (
	ReasonSpecial    = "device nodes, FIFOs and sockets are not committed"
	ReasonTooLarge   = "file larger than the size limit"
	ReasonTooDeep    = "nested deeper than the depth limit"
	ReasonTooLong    = "path longer than 4095 bytes"
	ReasonLinkEscape = "symlink target leaves the working directory"
	ReasonChanged    = "staged entry changed since it was scanned"
	ReasonParent     = "parent directory is not in the working directory"
	ReasonSymlinkW   = "path crosses a symlink or mount point in the working directory"
	ReasonUnderDel   = "path is below an entry removed or replaced by the same commit"
	ReasonDuplicate  = "path appears twice in the change list"
)

// Sentinel errors.
var (
	ErrScopeOpen  = errors.New("staging: a scope is already open")
	ErrNoScope    = errors.New("staging: no scope is open")
	ErrNotMounted = errors.New("staging: merged view is not mounted")
	ErrLocked     = errors.New("staging: state directory is in use by another process")
	ErrCorrupt    = errors.New("staging: corrupt state file")
	ErrBadPath    = errors.New("staging: invalid path")
	ErrChanged    = errors.New("staging: " + ReasonChanged)
	ErrClosed     = errors.New("staging: stager is closed")
)

// checkRel validates a path relative to W: non-empty, no leading or
// trailing slash, no empty, "." or ".." components, no NUL.
func checkRel(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty", ErrBadPath)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("%w: %q contains a NUL byte", ErrBadPath, p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("%w: %q is not a clean relative path", ErrBadPath, p)
		}
	}
	return nil
}

// linkEscapes reports whether a symlink at linkPath (relative to W) with
// target leaves W when resolved lexically from the link's directory.
// Absolute targets always leave W: on the host they name host paths.
func linkEscapes(linkPath, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.IndexByte(target, 0) >= 0 {
		return true
	}
	depth := strings.Count(path.Dir(linkPath), "/") + 1
	if path.Dir(linkPath) == "." {
		depth = 0
	}
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

// joinRel joins a relative directory ("" for W's root) and a name.
func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// splitRel splits a relative path into its directory ("" for the root)
// and its last component.
func splitRel(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p
	}
	return p[:i], p[i+1:]
}

// under reports whether p is strictly below dir (relative paths).
func under(p, dir string) bool {
	return len(p) > len(dir) && strings.HasPrefix(p, dir) && p[len(dir)] == '/'
}

// pathLess orders paths so that a directory comes right before
// everything below it: components compare bytewise, '/' sorts first.
func pathLess(a, b string) bool {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return true
		}
		if cb == '/' {
			return false
		}
		return ca < cb
	}
	return len(a) < len(b)
}

// stripMode removes setuid, setgid and sticky from raw st_mode bits and
// returns the permission bits and whether anything was removed.
func stripMode(raw uint32) (fs.FileMode, bool) {
	const special = 0o7000
	return fs.FileMode(raw & 0o777), raw&special != 0
}

// modeChanged reports whether the staged raw mode u is a change to W's
// raw mode w, as Commit would write it (set-id and sticky bits removed):
// an untouched copy-up keeps W's bits, and a staged mode that only adds
// bits Commit strips is no change either.
func modeChanged(u, w uint32) bool {
	u &= 0o7777
	w &= 0o7777
	return u != w && u&0o777 != w
}
