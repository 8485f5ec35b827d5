package executor

import (
	"fmt"
	"slices"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// Schedule is where every op runs for steps of at least minBatch tokens,
// cut into segments (maximal runs of ops on one backend) with the
// activations that cross between them, and the accelerator's segments
// compiled.
type Schedule struct {
	minBatch int
	dev      []plan.Backend // by op
	stream   []bool         // by unit: runs on the accelerator, its weights streamed
	split    []int          // by unit: an expert layer split with the host at this expert (0: none)
	segs     []segment
	acc      backend.Schedule
}

// segment is a maximal run of ops on one backend.
type segment struct {
	onDevice bool
	lo, hi   int
	compiled backend.Segment // onDevice: the compiled segment
}

// OnDevice says whether op runs on the accelerator in s.
func (s *Schedule) OnDevice(op int) bool { return s.dev[op] == plan.GPU }

// Fits says whether the schedule's streamed weights fit the staging ring
// side by side, so that only the first of a run of steps copies them.
func (s *Schedule) Fits() bool { return s.acc != nil && s.acc.Fits() }

// release destroys what the accelerator compiled of s.
func (s *Schedule) release() {
	if s.acc != nil {
		_ = s.acc.Release()
	}
}

// streamed lists the matrices s streams.
func (s *Schedule) streamed(units []model.Unit) map[*ir.Weight]bool {
	out := map[*ir.Weight]bool{}
	for i, u := range units {
		if s.stream[i] {
			for _, w := range u.Mats {
				out[w] = true
			}
		}
	}
	return out
}

// transfer is one buffer moved before op `before` to backend `to`.
type transfer struct {
	buf    ir.BufID
	before int
	to     plan.Backend
}

// transfers walks a schedule's ops and lists every read of a buffer whose
// current rows the other backend wrote: those move first. Every step
// starts with no buffer valid anywhere (the embedding writes the first).
func transfers(p *ir.Program, dev []plan.Backend) []transfer {
	var out []transfer
	const hostValid, devValid = 1, 2
	valid := make([]uint8, len(p.Bufs))
	bit := func(d plan.Backend) uint8 {
		if d == plan.GPU {
			return devValid
		}
		return hostValid
	}
	for i := range p.Ops {
		op := &p.Ops[i]
		b := bit(dev[i])
		for _, r := range op.Reads() {
			if valid[r] != 0 && valid[r]&b == 0 {
				out = append(out, transfer{buf: r, before: i, to: dev[i]})
				valid[r] |= b
			}
		}
		for _, w := range op.Writes() {
			valid[w] = b
		}
	}
	return out
}

// crossingBuffers marks the buffers some schedule moves between backends:
// the host backend keeps those in mapped pinned memory. With promotion,
// every buffer a host op touches may cross.
func crossingBuffers(p *ir.Program, scheds []*Schedule, promotable bool, onHost []bool) map[ir.BufID]bool {
	cross := map[ir.BufID]bool{}
	for _, s := range scheds {
		for _, t := range transfers(p, s.dev) {
			cross[t.buf] = true
		}
	}
	if promotable {
		for i := range p.Ops {
			if onHost[i] {
				for _, b := range p.Ops[i].Buffers() {
					cross[b] = true
				}
			}
		}
	}
	return cross
}

// compile cuts a schedule into segments, attaches its transfers and
// compiles the accelerator's segments.
func (c *Context) compile(s *Schedule) error {
	p := c.m.Prog
	// A routed unit's ops are a segment of their own: the host takes part
	// in them, so they never replay from a graph, and the ops around them
	// still do.
	routedOp := make([]bool, len(p.Ops))
	for i, u := range c.units {
		if i < len(s.split) && s.split[i] == backend.SplitRouted {
			for op := u.Lo; op < u.Hi; op++ {
				routedOp[op] = true
			}
		}
	}
	for i := 0; i < len(p.Ops); {
		j := i + 1
		for j < len(p.Ops) && s.dev[j] == s.dev[i] && routedOp[j] == routedOp[i] {
			j++
		}
		s.segs = append(s.segs, segment{onDevice: s.dev[i] == plan.GPU, lo: i, hi: j})
		i = j
	}
	var specs []backend.SegmentSpec
	devIndex := make([]int, len(s.segs)) // segment -> its spec
	segOf := func(op int) int {
		for k, sg := range s.segs {
			if op >= sg.lo && op < sg.hi {
				return k
			}
		}
		return -1
	}
	for k, sg := range s.segs {
		if sg.onDevice {
			devIndex[k] = len(specs)
			specs = append(specs, backend.SegmentSpec{Lo: sg.lo, Hi: sg.hi, Logits: sg.hi == len(p.Ops), Split: c.splits(s, sg.lo, sg.hi)})
		}
	}
	for _, t := range transfers(p, s.dev) {
		k := segOf(t.before)
		hb := c.hostOf[t.buf]
		if hb == nil {
			return fmt.Errorf("executor: buffer %s crosses but has no mapped host memory", p.Bufs[t.buf].Name)
		}
		tr := backend.Transfer{Buf: t.buf, Host: hb}
		if t.to == plan.GPU {
			specs[devIndex[k]].In = append(specs[devIndex[k]].In, tr)
			continue
		}
		// To the host: the last device segment before sends it back.
		last := -1
		for q := k - 1; q >= 0; q-- {
			if s.segs[q].onDevice {
				last = q
				break
			}
		}
		if last < 0 {
			return fmt.Errorf("executor: buffer %s moves to the host before op %d but no device segment wrote it", p.Bufs[t.buf].Name, t.before)
		}
		specs[devIndex[last]].Out = append(specs[devIndex[last]].Out, tr)
	}
	if len(specs) == 0 {
		return nil
	}
	acc, err := c.dev.Compile(specs, s.streamed(c.units))
	if err != nil {
		return err
	}
	s.acc = acc
	compiled := acc.Segments()
	for k := range s.segs {
		if s.segs[k].onDevice {
			s.segs[k].compiled = compiled[devIndex[k]]
		}
	}
	return nil
}

// splits is the split expert ops (backend.SegmentSpec.Split) of schedule s
// among ops [lo, hi), nil when none.
func (c *Context) splits(s *Schedule, lo, hi int) map[int]int {
	var out map[int]int
	for i, u := range c.units {
		if i >= len(s.split) || s.split[i] == 0 || u.Hi <= lo || u.Lo >= hi {
			continue
		}
		for op := max(u.Lo, lo); op < min(u.Hi, hi); op++ {
			if c.m.Prog.Ops[op].Class().Experts {
				if out == nil {
					out = map[int]int{}
				}
				out[op] = s.split[i]
			}
		}
	}
	return out
}

// Promotion compiles the decode schedule that also runs the promoted units
// (by unit) on the accelerator, their weights streamed.
func (c *Context) Promotion(promote []bool) (*Schedule, error) {
	base := c.scheds[0]
	s := &Schedule{minBatch: 1, dev: slices.Clone(base.dev), stream: slices.Clone(base.stream), split: slices.Clone(base.split)}
	for i, u := range c.units {
		if promote[i] {
			s.stream[i], s.split[i] = true, 0
			for op := u.Lo; op < u.Hi; op++ {
				s.dev[op] = plan.GPU
			}
		}
	}
	if err := c.compile(s); err != nil {
		return nil, fmt.Errorf("promotion: %w", err)
	}
	return s, nil
}

// Release destroys a schedule made by Promotion.
func (c *Context) Release(s *Schedule) {
	if s != nil && s != c.scheds[0] {
		s.release()
	}
}

// Base is the decode schedule of the layout: units where they are
// resident.
func (c *Context) Base() *Schedule { return c.scheds[0] }
