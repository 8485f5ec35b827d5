package placement

import (
	"testing"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// BenchmarkReplan14B is a decode step's re-planning at the Qwen3-14B
// shape, as promoter.schedule runs it: the promotion DP, the kept plan,
// no promotion's timeline and the host-memory bounds of the three (what
// `ats bench` reports as a re-plan's DPs), on 322 units of which the
// products of every other layer are resident.
func BenchmarkReplan14B(b *testing.B) {
	units, prof, resident := synthUnits14B()
	const ring, nvocab = 144 << 20, 151936
	e := plan.Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: prof.Stream.BytesPerSec}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sol, err := plan.Promote(promoteProblem(prof, units, resident, ring, nvocab, e))
		if err != nil {
			b.Fatal(err)
		}
		kept := keptUnits(prof, units, resident, ring, promoteProblem(prof, units, resident, ring, nvocab, e), e)
		none := make([]bool, len(units))
		prNone := promoteProblem(prof, units, resident, ring, nvocab, e)
		tNone, _ := prNone.Timeline(none)
		_ = max(sol.Time, hostBoundOf(prof, units, resident, sol.Promote, false, e)) + max(kept.Time, hostBoundOf(prof, units, resident, kept.Promote, true, e)) +
			max(tNone, hostBoundOf(prof, units, resident, none, false, e))
	}
}

// synthUnits14B is the 14B's units (the embedding, 40 layers of Q, K, V,
// attention, output, gate, up, down, the head) with a profile of plausible
// times, and a residency of every other layer's products.
func synthUnits14B() ([]model.Unit, *plan.Profile, func(int) bool) {
	prof := &plan.Profile{Batches: []int{1, 32, 128, 512}, Stream: plan.Link{BytesPerSec: 50e9}, HostRead: 110e9}
	for range prof.Batches {
		prof.Switch = append(prof.Switch, plan.Link{Latency: 12e-6, BytesPerSec: 20e9})
	}
	var units []model.Unit
	add := func(op ir.OpKind, bytes int64, cpu, gpu float64) {
		u := model.Unit{Index: len(units), Name: "u", Op: op, Bytes: bytes, DecodeBytes: bytes, InBytes: 4 * 5120, Layer: len(units) / 8,
			Streamable: op == ir.OpMatMul}
		units = append(units, u)
		t := plan.UnitTimes{Name: "u"}
		for range prof.Batches {
			t.CPU, t.GPU = append(t.CPU, cpu), append(t.GPU, gpu)
		}
		prof.Units = append(prof.Units, t)
	}
	add(ir.OpEmbed, 400e6, 1e-6, 1e-6)
	for l := 0; l < 40; l++ {
		for _, mb := range []float64{14, 3, 3} {
			add(ir.OpMatMul, int64(mb*1e6), mb*1e6/100e9, mb*1e6/3e12+5e-6)
		}
		add(ir.OpAttention, 1<<20, 1e-4, 3e-5)
		for _, mb := range []float64{14, 49, 49, 60} {
			add(ir.OpMatMul, int64(mb*1e6), mb*1e6/100e9, mb*1e6/3e12+5e-6)
		}
	}
	add(ir.OpMatMul, 500e6, 5e-3, 2e-4)
	units[len(units)-1].Output, units[len(units)-1].Streamable = true, false
	resident := func(i int) bool { return units[i].Layer%2 == 0 || units[i].Output }
	return units, prof, resident
}
