package executor

import (
	"testing"

	"github.com/atsinfer/ats/internal/oracletest"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

func openOracle(t *testing.T, name string) *model.Model { return oracletest.Open(t, name) }

func programUnits(p *ir.Program, ctx int) []model.Unit {
	return model.Units(p, model.KV{Rows: ctx, Type: kvcache.F16}, nil)
}

// TestTransfers checks the executor's coherence walk: with units
// alternating between the backends, every read sees the rows written last,
// on its own backend or moved there just before.
func TestTransfers(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64)
	p := m.Prog
	dev := make([]plan.Backend, len(p.Ops))
	for _, u := range units {
		for i := u.Lo; i < u.Hi; i++ {
			dev[i] = plan.Backend(u.Index % 2)
		}
	}
	moves := transfers(p, dev)
	if len(moves) == 0 {
		t.Fatal("no transfers for alternating units")
	}
	// Replay: where is each buffer valid?
	valid := map[ir.BufID]map[plan.Backend]bool{}
	k := 0
	for i := range p.Ops {
		for k < len(moves) && moves[k].before == i {
			mv := moves[k]
			if valid[mv.buf] == nil || valid[mv.buf][mv.to] {
				t.Fatalf("op %d: move of %s to %s, which is unwritten or already there", i, p.Bufs[mv.buf].Name, mv.to)
			}
			valid[mv.buf][mv.to] = true
			k++
		}
		op := &p.Ops[i]
		for _, r := range op.Reads() {
			if !valid[r][dev[i]] {
				t.Fatalf("op %d (%s on %s) reads %s, not valid there", i, op.Kind, dev[i], p.Bufs[r].Name)
			}
		}
		for _, w := range op.Writes() {
			valid[w] = map[plan.Backend]bool{dev[i]: true}
		}
	}
	// All on one backend: nothing moves.
	for i := range dev {
		dev[i] = plan.GPU
	}
	if moves := transfers(p, dev); len(moves) != 0 {
		t.Errorf("all on the GPU: %d transfers", len(moves))
	}
}

// TestSchedules checks that a layout's schedules run resident units on
// the device, streamed ones on the device from their batch size on, and
// the rest on the host.
func TestSchedules(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64)
	l := HostOnly(units)
	l.Resident[1] = true
	stream := make([]bool, len(units))
	stream[2] = true
	l.Prefill = []PrefillLayout{{MinBatch: 32, Stream: stream}, {MinBatch: 128, Stream: make([]bool, len(units))}}
	ss := l.schedules(512)
	if len(ss) != 3 || ss[0].minBatch != 1 || ss[1].minBatch != 32 || ss[2].minBatch != 128 {
		t.Fatalf("schedules %+v", ss)
	}
	at := func(s *Schedule, u int) plan.Backend { return s.dev[units[u].Lo] }
	if at(ss[0], 1) != plan.GPU || at(ss[0], 2) != plan.CPU || at(ss[1], 2) != plan.GPU || at(ss[2], 2) != plan.CPU {
		t.Errorf("unit 1 (resident) and 2 (streamed at 32..127) on %v %v %v %v", at(ss[0], 1), at(ss[0], 2), at(ss[1], 2), at(ss[2], 2))
	}
	if !ss[1].stream[2] || ss[0].stream[2] || !ss[1].streamed(units)[units[2].Mats[0]] {
		t.Error("unit 2 should stream in the second schedule only")
	}
	if got := l.schedules(64); len(got) != 2 {
		t.Errorf("batches of 64: %d schedules, want 2", len(got))
	}
}

// TestRoutedSchedule checks that a layout's routed expert units
// (Layout.Routed) run on the device in the decode schedule, marked
// backend.SplitRouted and not streamed whole by prefill's rules, that
// resident units are never routed, and that the device config carries
// the share and keeps the router resident.
func TestRoutedSchedule(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	units := programUnits(m.Prog, 64)
	l := HostOnly(units)
	l.Routed = make([]bool, len(units))
	var experts []int
	for i, u := range units {
		if u.Experts > 0 {
			experts = append(experts, i)
			l.Routed[i] = true
		}
	}
	if len(experts) < 2 {
		t.Fatalf("%d expert units", len(experts))
	}
	l.Resident[experts[1]] = true // resident: never routed
	l.RoutedShare, l.RoutedExperts = 0.5, 4
	dec := l.schedules(64)[0]
	u0, u1 := experts[0], experts[1]
	if dec.split[u0] != backend.SplitRouted || !dec.stream[u0] || dec.dev[units[u0].Lo] != plan.GPU {
		t.Errorf("routed unit %s: split %d, stream %v, on %v", units[u0].Name, dec.split[u0], dec.stream[u0], dec.dev[units[u0].Lo])
	}
	if dec.split[u1] != 0 || dec.stream[u1] {
		t.Errorf("resident unit %s: split %d, stream %v", units[u1].Name, dec.split[u1], dec.stream[u1])
	}
	cfg, ok := DeviceConfig(m, l, Options{Batch: 64})
	if !ok || cfg.RoutedShare != 0.5 || cfg.RoutedExperts != 4 {
		t.Errorf("device config: ok %v, share %g, experts %d", ok, cfg.RoutedShare, cfg.RoutedExperts)
	}
	// The router lives on the device; the expert stacks may stream (the
	// file's pages pinned, the ring sized for them), never resident.
	for _, w := range units[u0].Mats {
		if stack := w.Experts() > 0; cfg.Resident[w] == stack || stack && !cfg.Streams[w] {
			t.Errorf("%s: resident %v, streams %v", w.Name, cfg.Resident[w], cfg.Streams[w])
		}
	}
	l.Routed = nil
	if cfg, _ := DeviceConfig(m, l, Options{Batch: 64}); cfg.RoutedExperts != 0 {
		t.Errorf("no routed units, yet %d routed experts in the device config", cfg.RoutedExperts)
	}
}
