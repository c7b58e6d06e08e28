package benchstat

import (
	"math"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{0.91, 0.95}, 0.93},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), c.in...)
		if got := Median(c.in); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("Median reordered its input: %v", c.in)
			}
		}
	}
	if got := Median([]time.Duration{2 * time.Millisecond, 4 * time.Millisecond}); got != 3*time.Millisecond {
		t.Errorf("Median of durations = %v, want 3ms", got)
	}
}

func TestQuantile(t *testing.T) {
	v := make([]int64, 100)
	for i := range v {
		v[i] = int64(100 - i) // 100 … 1, unsorted
	}
	for _, c := range []struct {
		q    float64
		want int64
	}{{0, 1}, {0.01, 1}, {0.5, 50}, {0.99, 99}, {1, 100}, {2, 100}, {-1, 1}} {
		if got := Quantile(v, c.q); got != c.want {
			t.Errorf("Quantile(1..100, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if v[0] != 100 {
		t.Error("Quantile reordered its input")
	}
	if got := Quantile([]float64{}, 0.5); got != 0 {
		t.Errorf("Quantile of nothing = %v", got)
	}
	if got := SortedQuantile([]int{1, 2, 3}, 0.5); got != 2 {
		t.Errorf("SortedQuantile = %v, want 2", got)
	}
	if got := Micros(1500 * time.Nanosecond); got != 1.5 {
		t.Errorf("Micros = %v", got)
	}
}
