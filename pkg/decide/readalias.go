package decide

// Names of the fields of an incoming file event (a read) that say which
// file was read, when the hook knows more than the path it was read by.
// A read's Obj is a path in the working directory, and the policy's
// sensitive and trusted sources are path globs: a symlink or a hard
// link is a second name for one file, and the label of a read must not
// depend on which name the agent used.
const (
	// FieldAlias (role target) is another name of the file read: the
	// path it was opened by when Obj is the path it resolves to, or
	// another link to the same inode. The read's label joins the view of
	// each alias (its source label and its location label) with Obj's.
	FieldAlias = "alias"
	// FieldUnresolved (role control; its value says why) marks a read
	// whose file the hook could not identify (the link changed in
	// between, the name is gone): its content is labelled with the
	// policy's highest level and untrusted, joined with Obj's view
	// (fail closed: never as the path alone).
	FieldUnresolved = "unresolved"
)

// aliasLabelLocked joins into l, the label of an incoming file event,
// the views of the other names of the file it read (FieldAlias) and the
// fail-safe label of a read the hook could not identify
// (FieldUnresolved). Labels are only joined, never lowered.
func (e *Engine) aliasLabelLocked(p *Policy, ev *Event, l Label) Label {
	for _, f := range ev.Fields {
		switch f.Name {
		case FieldAlias:
			if f.Value == "" || f.Value == ev.Obj {
				continue
			}
			alias := Event{Ch: ChanFile, Dir: In, Obj: f.Value, Op: ev.Op}
			l = l.Combine(p.SourceLabel(&alias))
			if ll, ok := e.locationLabel(f.Value); ok {
				l = l.Combine(ll)
			}
		case FieldUnresolved:
			l = l.Combine(Label{Integrity: Untrusted, Level: p.TopLevel()})
		}
	}
	return l
}
