// Package opstats accumulates time per named step and batch size, and
// prints it as one table per batch size: the CPU backend's op profile
// (ATS_CPU_OPS_PROFILE) and the GPU executor's (ATS_GPU_PROFILE).
package opstats

import (
	"fmt"
	"io"
	"sort"
	"time"
)

// Table holds the times; the zero value is ready.
type Table struct {
	byTok map[int]*Runs
}

// Runs are the times of the batches of one size.
type Runs struct {
	Batches int
	Wall    time.Duration // wall time of the batches, where the caller counts it
	Total   map[string]time.Duration
	Calls   map[string]int
}

func (t *Table) runs(n int) *Runs {
	if t.byTok == nil {
		t.byTok = map[int]*Runs{}
	}
	r := t.byTok[n]
	if r == nil {
		r = &Runs{Total: map[string]time.Duration{}, Calls: map[string]int{}}
		t.byTok[n] = r
	}
	return r
}

// Add adds d to step name of batches of n tokens.
func (t *Table) Add(n int, name string, d time.Duration) {
	r := t.runs(n)
	r.Total[name] += d
	r.Calls[name]++
}

// Batch counts a batch of n tokens that took wall.
func (t *Table) Batch(n int, wall time.Duration) {
	r := t.runs(n)
	r.Batches++
	r.Wall += wall
}

// Format is how Report prints a table.
type Format struct {
	// Header is the line before batches of n tokens' steps; sum is their
	// time per batch in ms.
	Header func(n int, r *Runs, sum float64) string
	Per    string // "per batch", "per run"
	Width  int    // of the name column
	// Part says a step is timed inside another (listed, not added to the
	// sum); nil: none is.
	Part func(name string) bool
}

// Report prints, for each batch size, the steps by decreasing time: calls,
// milliseconds per batch, microseconds per call, share of the sum.
func (t *Table) Report(w io.Writer, f Format) {
	var toks []int
	for n := range t.byTok {
		toks = append(toks, n)
	}
	sort.Ints(toks)
	for _, n := range toks {
		r := t.byTok[n]
		var names []string
		var sum time.Duration
		for name, d := range r.Total {
			names = append(names, name)
			if f.Part == nil || !f.Part(name) {
				sum += d
			}
		}
		sort.Slice(names, func(i, j int) bool { return r.Total[names[i]] > r.Total[names[j]] })
		per := float64(max(r.Batches, 1))
		fmt.Fprintln(w, f.Header(n, r, ms(sum)/per))
		for _, name := range names {
			d := r.Total[name]
			fmt.Fprintf(w, "  %-*s %5d %s %9.3f ms %s %9.2f µs per call %5.1f%%\n",
				f.Width, name, int(float64(r.Calls[name])/per), f.Per, ms(d)/per, f.Per, ms(d)*1e3/float64(r.Calls[name]), 100*float64(d)/float64(max(sum, 1)))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
