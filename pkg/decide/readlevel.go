package decide

// ReadLevel is the highest level of what the agent has read so far: what
// an opaque effect is taken to carry. A released opaque connection (TLS
// passed through without interception) whose ReadLevel rose since its
// decision is decided again before more of it passes.
func (e *Engine) ReadLevel() Level {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sensMax
}
