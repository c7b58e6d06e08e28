package modelsrv

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The server plays the script turn by turn (the turn is the number of
// tool outputs sent back) and streams the events Codex reads.
func TestScript(t *testing.T) {
	s := &Server{Script: []Step{{Cmd: "cat task.txt"}, {Message: "finished"}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	post := func(body string) []map[string]any {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/v1/responses", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		var evs []map[string]any
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev map[string]any
				if err := json.Unmarshal([]byte(d), &ev); err != nil {
					t.Fatalf("event %q: %v", d, err)
				}
				evs = append(evs, ev)
			}
		}
		return evs
	}
	evs := post(`{"model":"m","stream":true,"input":[{"type":"message","role":"user","content":[]}]}`)
	if len(evs) != 3 || evs[0]["type"] != "response.created" || evs[2]["type"] != "response.completed" {
		t.Fatalf("events: %v", evs)
	}
	item := evs[1]["item"].(map[string]any)
	if item["type"] != "function_call" || item["name"] != "exec_command" || !strings.Contains(item["arguments"].(string), `"cat task.txt"`) {
		t.Errorf("turn 0 item: %v", item)
	}
	evs = post(`{"model":"m","input":[{"type":"function_call_output","call_id":"call_0","output":"the task"}]}`)
	item = evs[1]["item"].(map[string]any)
	if item["type"] != "message" || !strings.Contains(mustJSON(item), "finished") {
		t.Errorf("turn 1 item: %v", item)
	}
	reqs := s.Requests()
	if len(reqs) != 2 || reqs[1].Turn != 1 || reqs[1].ToolOutputs[0] != "the task" || reqs[0].Auth != "Bearer k1" {
		t.Errorf("recorded: %+v", reqs)
	}
	// Output given as content parts.
	post(`{"model":"m","input":[{"type":"function_call_output","output":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},{"type":"function_call_output","output":"c"}]}`)
	if r := s.Requests()[2]; r.Turn != 2 || r.ToolOutputs[0] != "ab" {
		t.Errorf("content parts: %+v", r)
	}
	resp, err := http.Post(srv.URL+"/v1/responses", "application/json", strings.NewReader("{"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad JSON: status %d", resp.StatusCode)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
