package executor

import (
	"slices"
	"sort"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// Layout is where a context runs each unit of the model: on the
// accelerator (resident: its weights, or its layer's KV cache, in device
// memory) or on the host; which host units a prompt batch of at least some
// size streams to the accelerator instead; and which units a decode step
// may promote (the Policy's choice, step by step). The planner
// (runtime/placement) makes it; the executor only follows it.
type Layout struct {
	Units    []model.Unit
	Resident []bool // by unit
	// Prefill lists, by ascending MinBatch, what batches of at least
	// MinBatch tokens stream.
	Prefill []PrefillLayout
	// RingBytes is the staging ring wanted (at least twice the largest
	// matrix that streams).
	RingBytes int64
	// Promotable marks the units a decode step may promote (nil: none).
	Promotable []bool
	// Routed marks the host's expert units whose decode steps hand the
	// accelerator a share of the experts their tokens chose
	// (backend.SplitRouted), by unit (nil: none); RoutedShare,
	// RoutedExperts and RoutedFixed are backend.ExecConfig's.
	Routed        []bool
	RoutedShare   float64
	RoutedExperts int
	RoutedFixed   bool
}

// routed says whether unit i's decode steps are routed.
func (l *Layout) routed(i int) bool {
	return l.Routed != nil && l.Routed[i] && !l.Resident[i] && l.Units[i].Experts > 0
}

// PrefillLayout is what batches of at least MinBatch tokens stream: Stream
// by unit, and for a streamed expert unit split with the host, the first
// expert the accelerator computes (Split, by unit; 0: not split).
type PrefillLayout struct {
	MinBatch int
	Stream   []bool
	Split    []int
}

// HostOnly is the layout of a context that runs every unit on the host.
func HostOnly(units []model.Unit) *Layout {
	return &Layout{Units: units, Resident: make([]bool, len(units))}
}

// AllDevice is the layout of a context that runs every unit on the
// accelerator.
func AllDevice(units []model.Unit) *Layout {
	l := &Layout{Units: units, Resident: make([]bool, len(units))}
	for i := range l.Resident {
		l.Resident[i] = true
	}
	return l
}

// AllResident says whether every unit lives on the accelerator.
func (l *Layout) AllResident() bool {
	return len(l.Units) > 0 && !slices.Contains(l.Resident, false)
}

// nOps is the program's op count (the units cover every op).
func (l *Layout) nOps() int {
	if n := len(l.Units); n > 0 {
		return l.Units[n-1].Hi
	}
	return 0
}

// schedules turns the layout into the executor's schedules for batches up
// to batch tokens: decode (and any batch below the first prefill layout)
// runs units where they are resident; a prefill schedule also runs its
// streamed units on the accelerator.
func (l *Layout) schedules(batch int) []*Schedule {
	nOps := l.nOps()
	mk := func(minBatch int, stream []bool, split []int) *Schedule {
		s := &Schedule{minBatch: minBatch, dev: make([]plan.Backend, nOps), stream: make([]bool, len(l.Units)), split: make([]int, len(l.Units))}
		for i, u := range l.Units {
			streams := stream != nil && stream[i]
			d := plan.CPU
			if l.Resident[i] || streams {
				d = plan.GPU
			}
			s.stream[i] = streams && !l.Resident[i]
			if s.stream[i] && u.Experts > 0 && split != nil {
				s.split[i] = split[i]
			}
			for op := u.Lo; op < u.Hi; op++ {
				s.dev[op] = d
			}
		}
		return s
	}
	var stream []bool
	var split []int
	for i := range l.Units {
		if l.routed(i) {
			if stream == nil {
				stream, split = make([]bool, len(l.Units)), make([]int, len(l.Units))
			}
			stream[i], split[i] = true, backend.SplitRouted
		}
	}
	out := []*Schedule{mk(1, stream, split)}
	for _, pl := range l.Prefill {
		if pl.MinBatch <= 1 || pl.MinBatch > batch {
			continue
		}
		out = append(out, mk(pl.MinBatch, pl.Stream, pl.Split))
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].minBatch < out[b].minBatch })
	return out
}

// deviceOps marks the ops that may run on the accelerator: in some
// schedule, or in a decode step that promotes their unit.
func (l *Layout) deviceOps(scheds []*Schedule) []bool {
	on := make([]bool, l.nOps())
	for _, s := range scheds {
		for i, d := range s.dev {
			on[i] = on[i] || d == plan.GPU
		}
	}
	for i, u := range l.Units {
		if l.Promotable != nil && l.Promotable[i] && !l.Resident[i] {
			for op := u.Lo; op < u.Hi; op++ {
				on[op] = true
			}
		}
	}
	return on
}

// UsesDevice says whether any schedule of batches up to batch tokens runs
// an op on the accelerator.
func (l *Layout) UsesDevice(batch int) bool {
	return slices.Contains(l.deviceOps(l.schedules(batch)), true)
}

// DeviceConfig is the accelerator's configuration for a context of m
// under layout l; ok is false when no op runs there.
func DeviceConfig(m *model.Model, l *Layout, opt Options) (cfg backend.ExecConfig, ok bool) {
	opt = opt.withDefaults()
	scheds := l.schedules(opt.Batch)
	onDev := l.deviceOps(scheds)
	if !slices.Contains(onDev, true) {
		return cfg, false
	}
	resident := map[*ir.Weight]bool{}
	streamed := map[*ir.Weight]bool{}
	for i, u := range l.Units {
		for _, w := range u.Mats {
			// A routed unit's router lives on the device: it routes
			// every decode step, and is small.
			if l.Resident[i] || l.routed(i) && w.Experts() == 0 {
				resident[w] = true
			}
			for _, s := range scheds {
				if s.stream[i] {
					streamed[w] = true
				}
			}
			if l.Promotable != nil && l.Promotable[i] && !l.Resident[i] {
				streamed[w] = true // a decode step may promote it
			}
		}
	}
	cfg = backend.ExecConfig{Batch: opt.Batch, LogitRows: logitRows(opt.Batch), KV: opt.KV, Runs: onDev,
		Resident: resident, Streams: streamed, RingBytes: l.RingBytes, Files: m.FileParts(), Options: opt.Device}
	for i := range l.Units {
		if l.routed(i) {
			cfg.RoutedExperts, cfg.RoutedShare, cfg.RoutedFixed = l.RoutedExperts, l.RoutedShare, l.RoutedFixed
		}
	}
	return cfg, true
}
