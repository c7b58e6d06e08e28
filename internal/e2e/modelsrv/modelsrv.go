// Package modelsrv is a scripted language-model server for end-to-end
// tests with real agent CLIs: it speaks the OpenAI Responses API
// (POST /v1/responses, streamed as server-sent events) and plays a fixed
// list of tool calls whatever the prompt, one per turn, then a final
// message. It records every request so a test can assert what the agent
// sent back (tool outputs, the credential it authenticated with).
//
// The events it streams are the ones Codex CLI reads
// (response.created, response.output_item.done with a function_call or
// a message item, response.completed); see docs/e2e.md.
package modelsrv

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Step is one turn of the script: a shell command the agent is asked to
// run (Codex's exec_command tool), or, when Cmd is empty, the final
// assistant message.
type Step struct {
	Cmd     string
	Message string
}

// Request is what the server saw of one call.
type Request struct {
	Auth        string   // the Authorization header
	Turn        int      // the step answered (0-based)
	ToolOutputs []string // the function_call_output items, in order
	Model       string
}

// Server answers /v1/responses from Script. The turn is the number of
// tool outputs the agent sent back, so a retried request is answered
// the same way.
type Server struct {
	Script []Step

	mu   sync.Mutex
	reqs []Request
}

// Requests returns the requests seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

type inputItem struct {
	Type   string          `json:"type"`
	Output json.RawMessage `json:"output"`
}

type responsesRequest struct {
	Model  string      `json:"model"`
	Stream bool        `json:"stream"`
	Input  []inputItem `json:"input"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, fmt.Sprintf(`{"error":{"message":%q}}`, "modelsrv: request: "+err.Error()), http.StatusBadRequest)
		return
	}
	rec := Request{Auth: r.Header.Get("Authorization"), Model: req.Model}
	for _, it := range req.Input {
		if it.Type == "function_call_output" {
			rec.ToolOutputs = append(rec.ToolOutputs, outputText(it.Output))
		}
	}
	rec.Turn = len(rec.ToolOutputs)
	s.mu.Lock()
	s.reqs = append(s.reqs, rec)
	s.mu.Unlock()

	step := Step{Message: "done"}
	if rec.Turn < len(s.Script) {
		step = s.Script[rec.Turn]
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	id := fmt.Sprintf("resp_%d", rec.Turn)
	var item any
	if step.Cmd != "" {
		args, _ := json.Marshal(map[string]any{"cmd": step.Cmd, "yield_time_ms": 30000})
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", rec.Turn),
			"call_id": fmt.Sprintf("call_%d", rec.Turn), "name": "exec_command", "arguments": string(args)}
	} else {
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_%d", rec.Turn), "role": "assistant",
			"status": "completed", "content": []any{map[string]any{"type": "output_text", "text": step.Message, "annotations": []any{}}}}
	}
	events := []map[string]any{
		{"type": "response.created", "response": map[string]any{"id": id, "status": "in_progress"}},
		{"type": "response.output_item.done", "output_index": 0, "item": item},
		{"type": "response.completed", "response": map[string]any{"id": id, "status": "completed",
			"usage": map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
				"output_tokens": 5, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 15}}},
	}
	f, _ := w.(http.Flusher)
	for _, ev := range events {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev["type"], b)
		if f != nil {
			f.Flush()
		}
	}
}

// outputText reads a function_call_output's output: a string, or a list
// of content parts with text.
func outputText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(raw)
}
