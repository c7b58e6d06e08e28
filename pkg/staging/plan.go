package staging

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Defaults for the Config limits.
const (
	DefaultMaxFileSize   = 1 << 30 // 1 GiB
	DefaultMaxDepth      = 256
	DefaultContentLimit  = 32 << 20 // 32 MiB
	DefaultContentMargin = 4096
	// maxPath is the longest relative path staging handles (PATH_MAX
	// minus the terminating NUL). Longer staged paths are refused.
	maxPath = 4095
)

// Owner is a numeric owner for entries carbd creates in W.
type Owner struct {
	UID, GID uint32
}

// Config describes one session's staging: the principal's working
// directory and carbd's state directory for it.
type Config struct {
	// WorkDir is W, the principal's working directory: absolute. It is
	// changed only by Commit.
	WorkDir string
	// StateDir is W's state: the committed labels and created-path index,
	// the pending labels, the lock, and the conflicts (the agent's
	// versions of paths the user changed under it). It must survive runs
	// and reboots (not under /run) and is absolute, neither inside
	// WorkDir nor containing it. Any filesystem.
	StateDir string
	// LayerDir holds what must be on W's mount: the base B (a hard-link
	// farm of W), the upper layer U, the overlay's work directory, the
	// base stamps and the commit journal (its pre-images are hard links
	// to W's entries and its new images are renamed into W; Open checks
	// the mount). Empty: StateDir (which must then be on W's mount).
	LayerDir string
	// MergedDir is where the merged view M is mounted; empty means
	// StateDir/merged. It must not be inside WorkDir.
	MergedDir string
	// MaxFileSize refuses staged regular files larger than this many
	// bytes; 0 means DefaultMaxFileSize.
	MaxFileSize int64
	// MaxDepth refuses staged entries nested deeper than this many
	// directories below W; 0 means DefaultMaxDepth.
	MaxDepth int
	// ContentLimit bounds Event.Content of a staged write (and the sum
	// of the user.* attribute values an event shows); 0 means
	// DefaultContentLimit. A change with more to show is not shown whole
	// (Event marks it "truncated") and is never to be released on it:
	// the bound is what one decision may hold in memory.
	ContentLimit int
	// ContentMargin is how many unchanged bytes around a changed region
	// an event's content includes; 0 means DefaultContentMargin.
	ContentMargin int
	// Owner of entries carbd creates in W; nil means the owner of W's
	// root directory. Replaced entries keep the owner they had.
	Owner *Owner
}

// MountOption is one overlayfs option; an empty Value is a flag.
type MountOption struct {
	Key, Value string
}

func (o MountOption) String() string {
	if o.Value == "" {
		return o.Key
	}
	return o.Key + "=" + o.Value
}

// Layout is the plan of a session's staging: every directory and the
// overlay mount. Plan builds it without touching the system.
type Layout struct {
	Work     string // W: the principal's working directory
	State    string // W's state directory (labels, lock, conflicts)
	Layers   string // the layer directory, on W's mount
	Base     string // B: hard-link farm of W made when the run starts, the overlay's lower layer
	BaseDone string // marker file: B is complete
	Seen     string // log of the stamps of W's entries as the agent's view has them
	Finished string // marker file: the run ended, its layers are discarded at the next Open
	Upper    string // U: the staging (upper) layer
	OvlWork  string // overlayfs work directory (same filesystem as U)
	Merged   string // M: the merged view exported to the guest
	Journal  string // the commit journal directory (exists only during a commit)
	Index    string // the committed labels and created-path index
	Pending  string // log of the labels of staged, uncommitted writes
	Lock     string // lock file: one carbd per state directory
	// Conflicts holds, per run, the agent's versions of the paths that
	// were not committed because W changed under them.
	Conflicts string

	FSType  string        // "overlay"
	Source  string        // mount source name shown in /proc/mounts
	Options []MountOption // overlayfs options, in order
	// NoDev and NoSUID are mount attributes of M: device nodes and
	// set-id bits in M are never honoured on the host.
	NoDev, NoSUID bool

	MaxFileSize   int64
	MaxDepth      int
	ContentLimit  int
	ContentMargin int
	Owner         *Owner
}

// MountData is the options as one comma-separated string, as mount(8)
// -o and mount(2) take them.
func (l *Layout) MountData() string {
	parts := make([]string, len(l.Options))
	for i, o := range l.Options {
		parts[i] = o.String()
	}
	return strings.Join(parts, ",")
}

// errConfig is wrapped by every Plan error.
var errConfig = errors.New("staging: config")

// Plan validates cfg and returns the session's layout. It is pure: it
// reads nothing from the file system.
//
// The overlay options are chosen so that the upper layer is a plain,
// unambiguous record of the staged state:
//   - redirect_dir=off: renaming a directory that has lower content fails
//     with EXDEV, and tools (mv) fall back to copy and delete, so every
//     entry in U sits at its real path (no trusted.overlay.redirect);
//   - metacopy=off: a copy-up always copies data, so a file in U holds its
//     full content (no metadata-only entries pointing into B);
//   - index=off, nfs_export=off: no inode index, so copy-up of a hard
//     link simply breaks the link and no origin verification ties U to B;
//   - xino=off: all layers are on one filesystem, so inode numbers are
//     already unique; this keeps behaviour independent of kernel config;
//   - M is mounted nodev,nosuid.
func Plan(cfg Config) (*Layout, error) {
	w, err := absClean("WorkDir", cfg.WorkDir)
	if err != nil {
		return nil, err
	}
	st, err := absClean("StateDir", cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if w == "/" {
		return nil, fmt.Errorf("%w: WorkDir must not be the root directory", errConfig)
	}
	if within(st, w) {
		return nil, fmt.Errorf("%w: StateDir %q is inside WorkDir %q", errConfig, st, w)
	}
	if within(w, st) {
		return nil, fmt.Errorf("%w: WorkDir %q is inside StateDir %q", errConfig, w, st)
	}
	ld := st
	if cfg.LayerDir != "" {
		if ld, err = absClean("LayerDir", cfg.LayerDir); err != nil {
			return nil, err
		}
		if within(ld, w) || within(w, ld) {
			return nil, fmt.Errorf("%w: LayerDir %q overlaps WorkDir %q", errConfig, ld, w)
		}
		if ld != st && (within(ld, st) || within(st, ld)) {
			return nil, fmt.Errorf("%w: LayerDir %q and StateDir %q are nested", errConfig, ld, st)
		}
	}
	l := &Layout{
		Work:      w,
		State:     st,
		Layers:    ld,
		Base:      filepath.Join(ld, "base"),
		BaseDone:  filepath.Join(ld, "base.done"),
		Seen:      filepath.Join(ld, "seen"),
		Finished:  filepath.Join(ld, "finished"),
		Upper:     filepath.Join(ld, "upper"),
		OvlWork:   filepath.Join(ld, "ovlwork"),
		Merged:    filepath.Join(ld, "merged"),
		Journal:   filepath.Join(ld, "journal"),
		Index:     filepath.Join(st, "index"),
		Pending:   filepath.Join(st, "pending"),
		Lock:      filepath.Join(st, "lock"),
		Conflicts: filepath.Join(st, "conflicts"),
		FSType:    "overlay",
		Source:    "carbd",
		NoDev:     true,
		NoSUID:    true,
	}
	if cfg.MergedDir != "" {
		m, err := absClean("MergedDir", cfg.MergedDir)
		if err != nil {
			return nil, err
		}
		if within(m, w) || within(w, m) {
			return nil, fmt.Errorf("%w: MergedDir %q overlaps WorkDir %q", errConfig, m, w)
		}
		for _, layer := range []string{l.Base, l.Upper, l.OvlWork, l.Journal} {
			if within(m, layer) || within(layer, m) {
				return nil, fmt.Errorf("%w: MergedDir %q overlaps layer %q", errConfig, m, layer)
			}
		}
		l.Merged = m
	}
	for _, f := range []struct{ name, p string }{{"base dir", l.Base}, {"upper dir", l.Upper}, {"overlay work dir", l.OvlWork}, {"MergedDir", l.Merged}} {
		if err := mountSafe(f.name, f.p); err != nil {
			return nil, err
		}
	}
	l.Options = []MountOption{
		{"lowerdir", l.Base},
		{"upperdir", l.Upper},
		{"workdir", l.OvlWork},
		{"index", "off"},
		{"nfs_export", "off"},
		{"redirect_dir", "off"},
		{"metacopy", "off"},
		{"xino", "off"},
	}
	switch {
	case cfg.MaxFileSize < 0:
		return nil, fmt.Errorf("%w: MaxFileSize %d is negative", errConfig, cfg.MaxFileSize)
	case cfg.MaxFileSize == 0:
		l.MaxFileSize = DefaultMaxFileSize
	default:
		l.MaxFileSize = cfg.MaxFileSize
	}
	if l.MaxDepth, err = positive("MaxDepth", cfg.MaxDepth, DefaultMaxDepth); err != nil {
		return nil, err
	}
	if l.ContentLimit, err = positive("ContentLimit", cfg.ContentLimit, DefaultContentLimit); err != nil {
		return nil, err
	}
	if l.ContentMargin, err = positive("ContentMargin", cfg.ContentMargin, DefaultContentMargin); err != nil {
		return nil, err
	}
	if cfg.Owner != nil {
		o := *cfg.Owner
		l.Owner = &o
	}
	return l, nil
}

func positive(name string, v, def int) (int, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("%w: %s %d is negative", errConfig, name, v)
	case v == 0:
		return def, nil
	}
	return v, nil
}

func absClean(name, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: %s is empty", errConfig, name)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w: %s %q contains a NUL byte", errConfig, name, p)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w: %s %q is not absolute", errConfig, name, p)
	}
	c := filepath.Clean(p)
	if len(c) > maxPath {
		return "", fmt.Errorf("%w: %s is longer than %d bytes", errConfig, name, maxPath)
	}
	return c, nil
}

// within reports whether p is dir or below it (both clean and absolute).
func within(p, dir string) bool {
	if p == dir {
		return true
	}
	if dir == "/" {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}

// mountSafe refuses paths that overlayfs option parsing would split or
// unescape: ',' separates options, ':' separates lower layers, '\\'
// escapes, and control characters have no place in a mount table.
func mountSafe(name, p string) error {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == ',' || c == ':' || c == '\\':
			return fmt.Errorf("%w: %s %q contains %q, which overlayfs options cannot carry", errConfig, name, p, c)
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("%w: %s %q contains control character %#x", errConfig, name, p, c)
		}
	}
	return nil
}
