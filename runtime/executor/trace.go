package executor

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/model"
)

// Trace writes the timeline of every batch as Chrome trace events
// (chrome://tracing, ui.perfetto.dev): the CPU segments on the worker
// pool (and the CPU's share of split MoE layers), the GPU segments on the
// compute stream and the weight uploads on the copy stream, so their
// overlap can be seen. Device times come from
// events recorded on the streams, placed on the host's clock at the
// batch's start.
type Trace struct {
	mu     sync.Mutex
	w      io.Writer
	start  time.Time
	events int
	err    error
}

// NewTrace starts a trace written to w; Close ends it.
func NewTrace(w io.Writer) *Trace {
	t := &Trace{w: w, start: time.Now()}
	_, t.err = io.WriteString(w, "{\"traceEvents\":[\n")
	t.meta(1, "CPU (worker pool)")
	t.meta(2, "GPU compute stream")
	t.meta(3, "GPU copy stream (weights)")
	return t
}

// hostSpan is a host segment's wall time.
type hostSpan struct {
	lo, hi     int
	start, end time.Time
}

type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"` // µs
	Dur  float64        `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

func (t *Trace) meta(tid int, name string) {
	t.emit(traceEvent{Name: "thread_name", Ph: "M", PID: 1, TID: tid, Args: map[string]any{"name": name}})
}

func (t *Trace) emit(e traceEvent) {
	if t.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.err = err
		return
	}
	sep := ",\n"
	if t.events == 0 {
		sep = ""
	}
	t.events++
	_, t.err = fmt.Fprintf(t.w, "%s%s", sep, b)
}

// step adds one step: n tokens from start, its host segments, and the
// device timeline dt (relative to the step's first event, recorded when
// the first device work of the step was queued at about start).
func (t *Trace) step(c *Context, n int, start time.Time, cpu []hostSpan, dt backend.Times) {
	t.mu.Lock()
	defer t.mu.Unlock()
	us := func(at time.Time) float64 { return float64(at.Sub(t.start).Nanoseconds()) / 1e3 }
	base := us(start)
	kind := "prefill"
	if n == 1 {
		kind = "decode"
	}
	if c.unitOf == nil {
		c.unitOf = model.UnitOfOp(c.units, len(c.m.Prog.Ops))
	}
	name := func(lo, hi int) string {
		a, b := c.units[c.unitOf[lo]], c.units[c.unitOf[hi-1]]
		if a.Index == b.Index {
			return a.Name
		}
		return a.Name + " … " + b.Name
	}
	for _, sp := range cpu {
		t.emit(traceEvent{Name: name(sp.lo, sp.hi), Cat: kind, Ph: "X", TS: us(sp.start), Dur: float64(sp.end.Sub(sp.start).Nanoseconds()) / 1e3, PID: 1, TID: 1,
			Args: map[string]any{"ops": fmt.Sprintf("%d-%d", sp.lo, sp.hi-1), "tokens": n}})
	}
	for _, sp := range dt.Host {
		t.emit(traceEvent{Name: sp.Name, Cat: kind, Ph: "X", TS: us(sp.Start), Dur: float64(sp.End.Sub(sp.Start).Nanoseconds()) / 1e3, PID: 1, TID: 1,
			Args: map[string]any{"tokens": n}})
	}
	for _, sp := range dt.Segments {
		t.emit(traceEvent{Name: name(sp.Lo, sp.Hi), Cat: kind, Ph: "X", TS: base + sp.Start*1e6, Dur: (sp.End - sp.Start) * 1e6, PID: 1, TID: 2,
			Args: map[string]any{"ops": fmt.Sprintf("%d-%d", sp.Lo, sp.Hi-1), "tokens": n, "waits_for_uploads": sp.Streams}})
	}
	for _, sp := range dt.Uploads {
		t.emit(traceEvent{Name: sp.Name, Cat: kind, Ph: "X", TS: base + sp.Start*1e6, Dur: (sp.End - sp.Start) * 1e6, PID: 1, TID: 3,
			Args: map[string]any{"bytes": sp.Bytes, "GB/s": float64(sp.Bytes) / max(sp.End-sp.Start, 1e-9) / 1e9}})
	}
}

// Close ends the trace's JSON.
func (t *Trace) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil {
		_, t.err = io.WriteString(t.w, "\n]}\n")
	}
	return t.err
}
