package cuda

import (
	"fmt"
	"io"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/internal/opstats"
)

// profileSpinCycles is the spin before a profiled run: ~30 ms at 1.5-2 GHz,
// longer than queuing a decode step of a 48-layer model takes.
const profileSpinCycles = 50_000_000

// profile accumulates device time per step name and batch size
// (backend.Options.Profile): every step of the executor is timed with
// device events and reported, when the Exec closes, as the device time per
// kind of step for each batch size seen. Runs launch one by one (no decode
// graph), behind a spinning kernel that holds the device until the host
// has queued the whole run, so the steps run back to back as in a graph
// and the events measure the kernels, not the host's launch rate. (Wall
// times include the spin.)
type profile struct {
	events []*cudadrv.Event // events[i] is recorded before step i; the last after them
	names  []string         // names[i]: the step after events[i]
	n      int              // events recorded in the current run
	tab    opstats.Table
}

func newProfile() *profile { return &profile{} }

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
	for i := 0; i+1 < p.n; i++ {
		d, err := cudadrv.Elapsed(p.events[i], p.events[i+1])
		if err != nil {
			return err
		}
		p.tab.Add(nTok, p.names[i], d)
	}
	p.n = 0
	p.tab.Batch(nTok, wall)
	return nil
}

func (p *profile) report(w io.Writer) {
	p.tab.Report(w, opstats.Format{
		Header: func(n int, r *opstats.Runs, sum float64) string {
			return fmt.Sprintf("GPU profile, runs of %d tokens: %d runs, wall %.3f ms per run, device time in steps %.3f ms per run",
				n, r.Batches, float64(r.Wall)/1e6/float64(r.Batches), sum)
		},
		Per: "per run", Width: 32,
	})
}

func (p *profile) close() {
	for _, e := range p.events {
		_ = e.Destroy()
	}
}
