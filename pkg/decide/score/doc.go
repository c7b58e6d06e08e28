// Package score computes carbd's annotation-free per-field scores: how
// much a field of an outgoing effect looks like it came from the untrusted
// context rather than from the trusted task prompt (role-stratified CRC
// paper, Eq. 4 and Supplement A, Eq. A.1):
//
//	s(x) = (sim(x, untrusted) − sim(x, trusted) + 1) / 2  ∈ [0, 1]
//
// Larger scores mean more untrusted influence; a field is allowed when its
// score is at most its role's calibrated threshold (package calib).
//
// # Similarities
//
// Every similarity is a containment: the fraction of the field's units
// that occur anywhere in the context.
//
//   - [KindToken]: units are tokens, maximal runs of letters and digits,
//     lowercased ("Bob@Evil.com" → bob, evil, com).
//   - [KindNgram]: units are character n-grams ([NgramN] = 4 runes) of
//     the value after normalisation (lowercase, everything but letters and
//     digits removed), which keeps signal when an attacker obfuscates a
//     value by spacing or punctuation ("e v i l . c o m" and "evil.com"
//     share every 4-gram). A value with fewer than NgramN letters and
//     digits has no n-gram and is scored by tokens instead.
//   - [KindMax]: the larger of the two (the more suspicious reading).
//
// Units are counted with multiplicity in the field and as a set in the
// context. A field with no unit at all (empty, or only punctuation) has
// similarity 0 to every context and scores 0.5: no evidence either way.
//
// # Incremental contexts and memory
//
// The engine scores online while the context grows, so a [Context] keeps
// hashed unit sets that [Context.Add] extends in time linear in the text
// added; nothing of the text itself is kept. Units are hashed to 64 bits
// with hash/maphash under a seed drawn once per process, so an attacker
// cannot search offline for values whose units collide with the context's.
//
// Memory is bounded: each of the two sets (tokens, n-grams) holds at most
// Config.MaxEntries exact hashes (default 1<<18, about 5 MiB per set at
// Go's map overhead). Units that arrive after a set is full go to a
// fixed-size Bloom filter of Config.OverflowBits bits (default 1<<21 bits,
// 256 KiB per set, two probes), allocated only when the set overflows.
// A Bloom filter has false positives and no false negatives, so an
// overflowed context can only over-report similarity: for the untrusted
// context that raises scores (more fields blocked, the safe direction);
// for the trusted prompt, which is small and never overflows in practice,
// it would lower them. [Context.Overflowed] says when it happened.
//
// A Context is not safe for concurrent use: Add must not run at the same
// time as any other method. Concurrent Sim and Score calls on contexts
// that are not being extended are safe.
//
// # Requirements
//
// None: standard library only, no kernel access.
//
// # Testing
//
// Table-driven unit tests with hand-computed similarities, properties
// (scores in [0,1]; a value added to the untrusted context and absent
// from the trusted one scores 1; obfuscation keeps n-gram signal; the
// overflow filter never loses a unit), a fuzz target on the tokeniser and
// benchmarks of the per-field score and of Add.
package score
