// Package llm is the decide.Oracle backed by a language model behind an
// OpenAI-compatible chat-completions endpoint (Kairos §III-D): the
// engine's deferred effects and their view go out as one request at
// temperature 0, and the answer is parsed strictly. It is the only part
// of the decision path that does network I/O, so it lives outside
// pkg/decide, which keeps the Oracle interface and the View and stays
// pure (no package of pkg/decide imports this one).
//
// # Failure
//
// Every failure is an error: a transport error or timeout, a status
// other than 200, a body that is not a chat completion, an answer that
// is not exactly one JSON object deciding only asked-about effects, each
// once, as "release" or "refuse". The engine refuses everything on an
// error, and an effect the answer does not mention (DESIGN.md guarantee
// 5).
//
// # Tests
//
// The tests run a real HTTP server (httptest) speaking the
// chat-completions API: the request's shape, the answer's parsing, every
// failure above, and that pkg/decide does not depend on this package.
package llm
