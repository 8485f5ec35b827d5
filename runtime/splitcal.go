package runtime

import (
	"fmt"
	"math"
	"slices"

	"github.com/atsinfer/ats/runtime/gpu"
	"github.com/atsinfer/ats/runtime/ir"
)

// The CPU's share of prefill batches' split MoE layers, calibrated on the
// batches that ran it. The planner times a share by the profile's quarter
// of each layer's experts under random routing (plan.UnitTimes.CPUShare);
// a prompt's routing is not random, and on the GPU machine the synthetic
// 30B-A3B's shares ran at 0.8-0.85 of that (its hot experts' many tokens
// fill the AMX tiles), so the planner kept a quarter of the experts on the
// CPU where a third ran the batch 5-8% faster. After each split batch the
// context compares the shares' measured time with the plan's; when the
// estimate moves by splitCalMoved or more, it plans the split again with
// the shares' times scaled, and recompiles the prefill schedules whose
// split changes (the streamed units, and so the ring, stay).
type splitCal struct {
	scale     float64         // the shares' time against the profile's (1 until a batch says otherwise)
	replans   int             // prefill split re-plans
	predicted map[int]float64 // by a re-planned schedule's batch size, the plan's seconds a batch
}

// splitCalMoved is how far the shares' measured time must move from the
// plan's before the split is planned again (the promoter's rule for
// decode estimates).
const splitCalMoved = 0.15

// observeSplit folds a prefill batch of n tokens that ran schedule s into
// the calibration: st counts the batch's split layers.
func (c *Context) observeSplit(s *schedule, n int, st gpu.SplitStats) error {
	if st.Layers == 0 || st.Host <= 0 || c.place == nil || c.place.prof == nil {
		return nil
	}
	pred := c.predictedShare(s, n)
	if !(pred > 0) {
		return nil
	}
	est := c.cal.scale * st.Host.Seconds() / float64(st.Layers) / pred
	if math.Abs(est/c.cal.scale-1) < splitCalMoved {
		return nil
	}
	return c.replanSplits(est)
}

// predictedShare is the plan's mean time of one split layer's CPU share in
// a batch of n tokens under schedule s (0: s splits nothing): the
// profile's at the schedule's batch size, scaled by the calibration and
// by the tokens (a share's time follows its slots).
func (c *Context) predictedShare(s *schedule, n int) float64 {
	pl := c.place
	prof := pl.prof
	b := prof.BatchIndex(s.minBatch)
	var sum float64
	layers := 0
	for i, u := range c.units {
		if i >= len(s.split) || s.split[i] == 0 {
			continue
		}
		ne := moeExperts(u)
		if ne == 0 || i >= len(prof.Units) {
			continue
		}
		sum += splitCPU(prof.Units[i], b, float64(s.split[i])/float64(ne), pl.packedAt(i))
		layers++
	}
	if layers == 0 {
		return 0
	}
	return c.cal.scale * sum / float64(layers) * float64(n) / float64(prof.Batches[b])
}

// replanSplits plans the split of every prefill schedule that splits MoE
// layers again, the shares' times scaled by scale, and recompiles those
// whose split changes.
func (c *Context) replanSplits(scale float64) error {
	pl := c.place
	prof := pl.prof
	for j, s := range c.scheds {
		if s.minBatch <= 1 || !slices.ContainsFunc(s.split, func(ks int) bool { return ks > 0 }) {
			continue
		}
		b := prof.BatchIndex(s.minBatch)
		stream, split, secs, err := prefillStreams(prof, c.units, pl, b, prof.Batches[b], c.m.Prog.Hyper, pl.RingBytes, true, scale)
		if c.cal.predicted == nil {
			c.cal.predicted = map[int]float64{}
		}
		if err != nil {
			return fmt.Errorf("prefill split: %w", err)
		}
		streams := map[string]bool{}
		for _, name := range stream {
			streams[name] = true
		}
		next := make([]int, len(s.split))
		same := true
		for i, u := range c.units {
			same = same && s.stream[i] == (streams[u.Name] && !pl.resident(i))
			if s.stream[i] && u.Op == ir.OpMoE {
				next[i] = split[u.Name]
			}
		}
		if !same || slices.Equal(next, s.split) {
			continue // only the split may move: the streamed units size the ring
		}
		if err := c.withSplit(j, next); err != nil {
			return err
		}
		if secs > 0 {
			c.cal.predicted[prof.Batches[b]] = secs
		}
	}
	c.cal.scale = scale
	c.cal.replans++
	return nil
}

// withSplit replaces schedule j by one that splits its streamed MoE
// layers as split says (by unit: the GPU's first expert, 0 for none),
// compiled; the old one's graphs are released.
func (c *Context) withSplit(j int, split []int) error {
	s := c.scheds[j]
	ns := &schedule{minBatch: s.minBatch, dev: s.dev, stream: s.stream, split: split}
	if err := c.compile(ns, c.hostOf); err != nil {
		return fmt.Errorf("prefill split: %w", err)
	}
	c.scheds[j] = ns
	if s.gpu != nil {
		if err := s.gpu.Release(); err != nil {
			return fmt.Errorf("prefill split: %w", err)
		}
	}
	return nil
}
