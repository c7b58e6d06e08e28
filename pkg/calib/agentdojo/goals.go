package agentdojo

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Goals holds the user task prompts and injection task goals of
// prompts-and-goals.json, per benchmark version and suite.
type Goals struct {
	// versions maps a version ("v1.x", "v1.2.1") to suite -> task -> text.
	versions map[string]map[string]map[string]string
	prompts  map[string]map[string]map[string]string
}

type wireSuiteGoals struct {
	Goals   map[string]string `json:"injection_tasks_GOAL"`
	Prompts map[string]string `json:"user_tasks_PROMPT"`
}

// LoadGoals reads prompts-and-goals.json. Its top-level keys name the
// benchmark version first ("v1.x (629-pair runs, ...)"); runs without a
// benchmark_version are v1.x.
func LoadGoals(path string) (*Goals, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("agentdojo: read goals: %w", err)
	}
	g, err := ParseGoals(data)
	if err != nil {
		return nil, fmt.Errorf("agentdojo: %s: %w", path, err)
	}
	return g, nil
}

// ParseGoals parses the content of prompts-and-goals.json.
func ParseGoals(data []byte) (*Goals, error) {
	var w map[string]map[string]wireSuiteGoals
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, err
	}
	g := &Goals{versions: map[string]map[string]map[string]string{}, prompts: map[string]map[string]map[string]string{}}
	for key, suites := range w {
		v, _, _ := strings.Cut(key, " ")
		if v == "" {
			return nil, fmt.Errorf("version key %q does not start with a version", key)
		}
		if _, dup := g.versions[v]; dup {
			return nil, fmt.Errorf("version %s given twice", v)
		}
		g.versions[v] = map[string]map[string]string{}
		g.prompts[v] = map[string]map[string]string{}
		for s, sg := range suites {
			g.versions[v][s] = sg.Goals
			g.prompts[v][s] = sg.Prompts
		}
	}
	return g, nil
}

// Versions lists the benchmark versions, sorted.
func (g *Goals) Versions() []string {
	var out []string
	for v := range g.versions {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

func (g *Goals) version(v string) string {
	if v == "" {
		return "v1.x"
	}
	return v
}

// Goal returns the goal of an injection task.
func (g *Goals) Goal(version, suite, task string) (string, bool) {
	s, ok := g.versions[g.version(version)][suite][task]
	return s, ok
}

// Prompt returns the prompt of a user task.
func (g *Goals) Prompt(version, suite, task string) (string, bool) {
	s, ok := g.prompts[g.version(version)][suite][task]
	return s, ok
}

// InjectionTasks lists the injection tasks of a suite in a version.
func (g *Goals) InjectionTasks(version, suite string) []string {
	var out []string
	for t := range g.versions[g.version(version)][suite] {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}
