package agentdojo

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/carbd/carbd/pkg/decide"
)

// LoadSuiteSpecsFS reads <suite>.yaml from fsys for every suite that has
// one, as LoadSuiteSpecs does from a directory; name stands for fsys in
// messages and in the policies' names (name/<suite>.yaml).
func LoadSuiteSpecsFS(fsys fs.FS, name string) (map[string]*SuiteSpec, error) {
	out := map[string]*SuiteSpec{}
	for _, s := range Suites {
		data, err := fs.ReadFile(fsys, s+".yaml")
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("agentdojo: load suite spec %s: %w", path.Join(name, s+".yaml"), err)
		}
		p, err := decide.ParsePolicy(path.Join(name, s+".yaml"), data)
		if err != nil {
			return nil, fmt.Errorf("agentdojo: load suite spec: %w", err)
		}
		out[s] = NewSuiteSpec(s, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("agentdojo: no suite policy (%s.yaml) in %s", strings.Join(Suites, ".yaml, "), name)
	}
	return out, nil
}
