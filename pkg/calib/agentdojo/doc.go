// Package agentdojo turns the recorded runs of the AgentDojo
// prompt-injection benchmark into carbd traces with per-field violation
// labels, for calibration (role-stratified CRC) and replay evaluation.
//
// Open reads a runs-*.tar.gz archive, a directory of them or an unpacked
// folder, streaming (nothing is unpacked to disk), and yields each run
// classified as benign, attacked or injection-as-prompt; a malformed
// member is reported with its archive and member path and iteration goes
// on. Run.Trace converts a run into decide.Events the way Kairos'
// AgentDojo harness does (tool calls out, results in, the task a ctrl
// event from the principal), with the roles, destination argument and
// kind the suite's policy declares (examples/agentdojo/<suite>.yaml, read
// as a SuiteSpec). Run.Fields labels every field of every call: violated
// when it carries a value of the injection goal that neither the user's
// task nor the suite's clean environment holds. docs/agentdojo.md states
// the rule, its limits and the figures on the real data.
//
// # Requirements
//
// None: pure Go (standard library and pkg/decide), no kernel imports
// (internal/deptest enforces it).
//
// # Testing
//
// Unit tests cover the parser, the value extraction and the trace shape;
// the tests on the real data (/work/shared/data/agentdojo, or
// $CARBD_AGENTDOJO_DATA; skipped when absent) check the counts of the
// data's README, every caveat it lists, hand-checked runs and the
// agreement of the labels with the benchmark's security outcome.
// FuzzParseRun fuzzes the run parser with a kept corpus under
// testdata/fuzz; BenchmarkReadAll measures reading every archive.
package agentdojo
