package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The example dashboard queries only metrics carbd exports.
func TestGrafanaDashboardMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "grafana-carbd.json"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	metrics{}.Describe(ch)
	close(ch)
	name := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range ch {
		if m := name.FindStringSubmatch(d.String()); m != nil {
			have[m[1]] = true
		}
	}
	used := regexp.MustCompile(`carbd_[a-z_]+`).FindAllString(string(b), -1)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no carbd metric")
	}
	for _, m := range used {
		if !have[m] {
			t.Errorf("the dashboard queries %s, which carbd does not export", m)
		}
	}
}
