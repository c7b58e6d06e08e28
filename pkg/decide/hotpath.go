package decide

// What the release path of Propose would otherwise allocate per decision:
// the effect's copy that Decision.Event points to, and the text of the
// release justification. Both live here, guarded by Engine.mu.

// slabEvents is how many decisions' events one allocation holds.
const slabEvents = 16

// eventSlab hands out the Events decisions point to (Decision.Event) from
// chunks of slabEvents, so a decision costs one allocation per
// slabEvents decisions instead of one each. A chunk is freed when no
// decision of it is referenced any more; a decision kept for long (held in
// a scope) gets an Event of its own (detach), so it pins no chunk.
type eventSlab struct {
	free []Event
}

// put returns a pointer to a fresh copy of ev.
func (s *eventSlab) put(ev *Event) *Event {
	if len(s.free) == 0 {
		s.free = make([]Event, slabEvents)
	}
	p := &s.free[0]
	*p = *ev
	s.free = s.free[1:]
	return p
}

// detach gives d an Event of its own, out of any chunk.
func detach(d *Decision) {
	if d.Event != nil {
		ev := *d.Event
		d.Event = &ev
	}
}

// releaseKey is what the release justification says.
type releaseKey struct {
	level, clearance Level
	party            string
}

// maxReleaseTexts bounds the memo of release justifications (one per
// party and level pair in practice).
const maxReleaseTexts = 1024

// releaseTexts memoises the release justification per policy, level,
// clearance and party: the text is the same for every effect with those,
// so it is built once, not per decision.
type releaseTexts struct {
	policy *Policy
	texts  map[releaseKey]string
}

// text returns the justification of a release whose data at level is
// cleared for party at clearance.
func (r *releaseTexts) text(p *Policy, level, clearance Level, party string) string {
	if r.policy != p {
		r.policy, r.texts = p, nil
	}
	k := releaseKey{level, clearance, party}
	if s, ok := r.texts[k]; ok {
		return s
	}
	s := "every gated value is derivable from trusted sources and its " + p.LevelName(level) +
		" data is cleared for " + partyOr(party) + " (" + p.LevelName(clearance) + ")"
	if r.texts == nil {
		r.texts = make(map[releaseKey]string)
	}
	if len(r.texts) < maxReleaseTexts {
		r.texts[k] = s
	}
	return s
}
