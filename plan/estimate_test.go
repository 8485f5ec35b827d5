package plan

import "testing"

// Moved: a relative move of th or more in any speed, scaled; the hand-over
// only with an absolute move of switchMoved as well.
func TestMoved(t *testing.T) {
	was := Estimates{CPU: 1, GPU: 2, Link: 50e9, Overlap: 1, Switch: 5e-6}
	for _, c := range []struct {
		name  string
		e     Estimates
		scale float64
		want  bool
	}{
		{"same", was, 1, false},
		{"CPU +14%", Estimates{CPU: 1.14, GPU: 2, Link: 50e9, Overlap: 1, Switch: 5e-6}, 1, false},
		{"CPU +16%", Estimates{CPU: 1.16, GPU: 2, Link: 50e9, Overlap: 1, Switch: 5e-6}, 1, true},
		{"CPU +30%, scaled by 3", Estimates{CPU: 1.3, GPU: 2, Link: 50e9, Overlap: 1, Switch: 5e-6}, 3, false},
		{"GPU x0.5, scaled by 3", Estimates{CPU: 1, GPU: 1, Link: 50e9, Overlap: 1, Switch: 5e-6}, 3, true},
		{"hand-over doubled, by 5 µs", Estimates{CPU: 1, GPU: 2, Link: 50e9, Overlap: 1, Switch: 10e-6}, 1, false},
		{"hand-over +20 µs", Estimates{CPU: 1, GPU: 2, Link: 50e9, Overlap: 1, Switch: 25e-6}, 1, true},
		{"link unknown now", Estimates{CPU: 1, GPU: 2, Overlap: 1, Switch: 5e-6}, 1, true},
	} {
		if got := Moved(c.e, was, 0.15, c.scale); got != c.want {
			t.Errorf("%s: Moved %v, want %v", c.name, got, c.want)
		}
	}
}
