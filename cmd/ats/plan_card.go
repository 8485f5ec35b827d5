package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// ats plan --gpu NAME: a placement for a GPU that is not here, from a
// roofline estimate of each unit (plan.Roofline: the card's published
// bandwidth and FLOPs, a CPU's) instead of a measured profile. It answers
// "what would ats do on a 6 GB laptop?" before buying or installing; every
// line it prints says it is an estimate.

// cardPlanOptions are plan's flags for a card that is not here.
type cardPlanOptions struct {
	gpu       string  // a card of plan.Cards
	vram      string  // its memory, or a card of its own with bandwidth
	bandwidth float64 // GB/s: a card of its own
	link      float64 // GB/s: the host link (0: the card's)
	cpuGBps   float64 // the CPU's memory bandwidth, GB/s
	cpuCores  int
}

func (o *cardPlanOptions) wanted() bool { return o.gpu != "" || o.vram != "" || o.bandwidth > 0 }

// card is the card the flags describe.
func (o *cardPlanOptions) card() (plan.Card, error) {
	var c plan.Card
	if o.gpu != "" {
		var err error
		if c, err = plan.FindCard(o.gpu); err != nil {
			return c, err
		}
	} else {
		if o.vram == "" || o.bandwidth <= 0 {
			return c, fmt.Errorf("a card of its own needs --gpu-vram and --gpu-bandwidth (or name one with --gpu)")
		}
		c = plan.Card{Name: "the card described", FLOPs: 50e12, LinkBW: 25e9}
	}
	if o.vram != "" {
		v, err := parseSize(o.vram)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("--gpu-vram %q: a size such as 8GiB", o.vram)
		}
		c.VRAM = v
	}
	if o.bandwidth > 0 {
		c.MemBW = o.bandwidth * 1e9
	}
	if o.link > 0 {
		c.LinkBW = o.link * 1e9
	}
	return c, nil
}

// cardShapes are the units of m as the estimate needs them, for a cache of
// kv whose decode steps attend to half of it on average.
func cardShapes(m *model.Model, kv model.KV) []plan.Shape {
	units := model.Units(m.Prog, kv, nil)
	elems := func(w *ir.Weight) float64 {
		n := 1.0
		for _, d := range w.Dims {
			n *= float64(d)
		}
		return n
	}
	var out []plan.Shape
	for _, u := range units {
		s := plan.Shape{Name: u.Name, Bytes: u.Bytes, ReadBytes: u.DecodeBytes, InBytes: u.InBytes}
		if u.Experts > 0 {
			s.Group = "expert"
		}
		for i := u.Lo; i < u.Hi; i++ {
			op := &m.Prog.Ops[i]
			switch {
			case op.Attn != nil:
				// Scores and the weighted sum over half the cache.
				depth := float64(kv.Rows) / 2
				s.FLOPsPerToken += 4 * depth * float64(op.Attn.NHeads*op.Attn.HeadSize)
				s.ReadBytes, s.Attention = u.Bytes/2, true
			case op.Class().Experts:
				s.FLOPsPerToken += 2 * elems(op.W)
				for _, w := range []*ir.Weight{op.Gate, op.Up, op.Down} {
					s.FLOPsPerToken += 2 * elems(w) * float64(op.TopK) / float64(op.Experts())
				}
			case op.W != nil && !op.W.IsVector() && !op.Class().Lookup:
				s.FLOPsPerToken += 2 * elems(op.W)
			}
		}
		out = append(out, s)
	}
	return out
}

// printCardPlan places m for the card by the estimate and prints it.
func printCardPlan(w io.Writer, m *model.Model, o cardPlanOptions, ctx int, kt kvcache.Type, batch int) error {
	card, err := o.card()
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	cpu := plan.LaptopCPU
	if o.cpuGBps > 0 {
		cpu.MemBW = o.cpuGBps * 1e9
	}
	if o.cpuCores > 0 {
		cpu.FLOPs *= float64(o.cpuCores) / float64(cpu.Cores)
		cpu.AttnFLOPs *= float64(o.cpuCores) / float64(cpu.Cores)
		cpu.Cores = o.cpuCores
	}
	h := m.Hyper()
	if ctx <= 0 {
		ctx = min(h.NCtxTrain, 4096)
	}
	// The context's buffers: activations of a batch, the logits, scratch
	// (a KV cache is a unit of its own).
	fixed := 4 * int64(batch) * (int64(h.NVocab) + 6*int64(h.NEmbd) + 3*int64(max(h.NFF, h.NFFExpert*max(h.NExpertUsed, 1))))
	shapes := cardShapes(m, model.KV{Rows: ctx, Type: kt})
	pl, units, err := plan.EstimateStatic(shapes, cpu, card, fixed)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	est := "estimate: "
	fmt.Fprintf(w, "%sa roofline from published figures, not measured: %s (%s VRAM, %.0f GB/s, %.0f TFLOP/s, link %.0f GB/s); CPU %d cores, %.0f GB/s\n",
		est, card.Name, executor.FormatBytes(card.VRAM), card.MemBW/1e9, card.FLOPs/1e12, card.LinkBW/1e9, cpu.Cores, cpu.MemBW/1e9)
	fmt.Fprintf(w, "%smodel %s: %s of weights; context %d positions (%s KV cache), buffers %s\n",
		est, m.File.Path, executor.FormatBytes(m.WeightBytes()), ctx, kt, executor.FormatBytes(fixed))
	var gpuUnits int
	var cpuBytes int64
	for i := range units {
		if pl.On[i] == plan.GPU {
			gpuUnits++
		} else {
			cpuBytes += units[i].Bytes
		}
	}
	fmt.Fprintf(w, "%s%d of %d units on the GPU (%s), %s on the CPU; decode about %.1f t/s (%.1f ms a token)\n",
		est, gpuUnits, len(units), executor.FormatBytes(pl.GPUBytes), executor.FormatBytes(cpuBytes), 1/pl.Time, 1e3*pl.Time)
	// Layer by layer: the roles of the layer, G (GPU) or C (CPU).
	byLayer := map[int][]string{}
	var order []int
	for i, s := range shapes {
		l := -1
		if k := strings.Index(s.Name, "blk."); k == 0 {
			fmt.Sscanf(s.Name, "blk.%d.", &l)
		}
		mark := "C"
		if pl.On[i] == plan.GPU {
			mark = "G"
		}
		role := s.Name
		if l >= 0 {
			role = strings.TrimPrefix(s.Name, fmt.Sprintf("blk.%d.", l))
		}
		role = strings.TrimSuffix(role, ".weight")
		if _, ok := byLayer[l]; !ok {
			order = append(order, l)
		}
		byLayer[l] = append(byLayer[l], role+":"+mark)
	}
	for _, l := range order {
		name := fmt.Sprintf("layer %d", l)
		if l < 0 {
			name = "outside the layers"
		}
		fmt.Fprintf(w, "%s%s: %s\n", est, name, strings.Join(byLayer[l], " "))
	}
	return nil
}
