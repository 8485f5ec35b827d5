package gpu

import (
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/atsinfer/ats/cudadrv"
)

// EnvGPUProfile set to "1" times every step of the GPU executor with device
// events and prints, when the context closes, the device time per kind of
// step for each batch size seen. Runs launch one by one (no decode graph),
// behind a spinning kernel that holds the device until the host has queued
// the whole run, so the steps run back to back as in a graph and the
// events measure the kernels, not the host's launch rate. (Wall times
// include the spin.)
const EnvGPUProfile = "ATS_GPU_PROFILE"

// profileSpinCycles is the spin before a profiled run: ~30 ms at 1.5-2 GHz,
// longer than queuing a decode step of a 48-layer model takes.
const profileSpinCycles = 50_000_000

// profile accumulates device time per step name and batch size.
type profile struct {
	events []*cudadrv.Event // events[i] is recorded before step i; the last after them
	names  []string         // names[i]: the step after events[i]
	n      int              // events recorded in the current run
	byTok  map[int]*profileRuns
}

type profileRuns struct {
	runs  int
	wall  time.Duration
	total map[string]time.Duration
	calls map[string]int
}

func newProfile() *profile {
	if os.Getenv(EnvGPUProfile) != "1" {
		return nil
	}
	return &profile{byTok: map[int]*profileRuns{}}
}

// mark records an event before the step called name (name "": after the
// last step).
func (p *profile) mark(ctx *cudadrv.Context, s *cudadrv.Stream, name string) error {
	if p.n == len(p.events) {
		e, err := ctx.NewEvent(cudadrv.EventDefault)
		if err != nil {
			return err
		}
		p.events = append(p.events, e)
		p.names = append(p.names, "")
	}
	p.names[p.n] = name
	err := p.events[p.n].Record(s)
	p.n++
	return err
}

// collect adds the step times of the run just synchronised.
func (p *profile) collect(nTok int, wall time.Duration) error {
	r := p.byTok[nTok]
	if r == nil {
		r = &profileRuns{total: map[string]time.Duration{}, calls: map[string]int{}}
		p.byTok[nTok] = r
	}
	for i := 0; i+1 < p.n; i++ {
		d, err := cudadrv.Elapsed(p.events[i], p.events[i+1])
		if err != nil {
			return err
		}
		r.total[p.names[i]] += d
		r.calls[p.names[i]]++
	}
	p.n = 0
	r.runs++
	r.wall += wall
	return nil
}

func (p *profile) report(w io.Writer) {
	var toks []int
	for n := range p.byTok {
		toks = append(toks, n)
	}
	sort.Ints(toks)
	for _, n := range toks {
		r := p.byTok[n]
		var names []string
		var sum time.Duration
		for name, d := range r.total {
			names = append(names, name)
			sum += d
		}
		sort.Slice(names, func(i, j int) bool { return r.total[names[i]] > r.total[names[j]] })
		fmt.Fprintf(w, "GPU profile, runs of %d tokens: %d runs, wall %.3f ms per run, device time in steps %.3f ms per run\n",
			n, r.runs, ms(r.wall)/float64(r.runs), ms(sum)/float64(r.runs))
		for _, name := range names {
			d := r.total[name]
			fmt.Fprintf(w, "  %-32s %5d per run %9.3f ms per run %8.2f µs per call %5.1f%%\n",
				name, r.calls[name]/r.runs, ms(d)/float64(r.runs), ms(d)*1e3/float64(r.calls[name]), 100*float64(d)/float64(sum))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func (p *profile) close() {
	for _, e := range p.events {
		_ = e.Destroy()
	}
}
