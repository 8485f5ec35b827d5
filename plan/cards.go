package plan

import (
	"fmt"
	"math"
	"strings"
)

// Planning for a GPU that is not here: a roofline estimate from a card's
// published figures instead of a measured profile, to answer "what would
// ats do on a 6 GB laptop?" before buying or installing. Every figure
// below is a published peak, so the estimate is an upper bound on speed;
// what ats prints from it must say it is an estimate.

// Card is a GPU's published figures.
type Card struct {
	Name   string
	VRAM   int64   // bytes
	MemBW  float64 // device memory bandwidth, bytes/s
	FLOPs  float64 // FP16 tensor-core peak without sparsity, FLOP/s
	LinkBW float64 // host link, bytes/s (PCIe generation and lanes as usually fitted)
}

const (
	gib  = 1 << 30
	gbps = 1e9
	tf   = 1e12
	// Usable PCIe rates (about 80% of the line rate).
	pcie3x16 = 12.5 * gbps
	pcie4x8  = 12.5 * gbps
	pcie4x16 = 25 * gbps
	pcie5x8  = 25 * gbps
	pcie5x16 = 50 * gbps
)

// Cards are common cards: laptop and desktop RTX 30, 40 and 50, the data
// centre's A100, H100, H200 and L4. Names are matched without case,
// spaces or dashes (FindCard).
var Cards = []Card{
	{"RTX 3050 Laptop", 4 * gib, 192 * gbps, 17 * tf, pcie4x8},
	{"RTX 3060 Laptop", 6 * gib, 336 * gbps, 22 * tf, pcie4x8},
	{"RTX 3070 Laptop", 8 * gib, 448 * gbps, 32 * tf, pcie4x8},
	{"RTX 3080 Laptop", 16 * gib, 448 * gbps, 38 * tf, pcie4x8},
	{"RTX 3060", 12 * gib, 360 * gbps, 25 * tf, pcie4x16},
	{"RTX 3070", 8 * gib, 448 * gbps, 40 * tf, pcie4x16},
	{"RTX 3080", 10 * gib, 760 * gbps, 59 * tf, pcie4x16},
	{"RTX 3090", 24 * gib, 936 * gbps, 71 * tf, pcie4x16},
	{"RTX 4050 Laptop", 6 * gib, 192 * gbps, 40 * tf, pcie4x8},
	{"RTX 4060 Laptop", 8 * gib, 256 * gbps, 44 * tf, pcie4x8},
	{"RTX 4070 Laptop", 8 * gib, 256 * gbps, 58 * tf, pcie4x8},
	{"RTX 4080 Laptop", 12 * gib, 432 * gbps, 100 * tf, pcie4x16},
	{"RTX 4090 Laptop", 16 * gib, 576 * gbps, 140 * tf, pcie4x16},
	{"RTX 4060", 8 * gib, 272 * gbps, 60 * tf, pcie4x8},
	{"RTX 4070", 12 * gib, 504 * gbps, 116 * tf, pcie4x16},
	{"RTX 4080", 16 * gib, 717 * gbps, 195 * tf, pcie4x16},
	{"RTX 4090", 24 * gib, 1008 * gbps, 330 * tf, pcie4x16},
	{"RTX 5060 Laptop", 8 * gib, 384 * gbps, 95 * tf, pcie5x8},
	{"RTX 5070 Laptop", 8 * gib, 384 * gbps, 120 * tf, pcie5x8},
	{"RTX 5080 Laptop", 16 * gib, 896 * gbps, 220 * tf, pcie5x16},
	{"RTX 5090 Laptop", 24 * gib, 896 * gbps, 300 * tf, pcie5x16},
	{"RTX 5060", 8 * gib, 448 * gbps, 95 * tf, pcie5x8},
	{"RTX 5070", 12 * gib, 672 * gbps, 123 * tf, pcie5x16},
	{"RTX 5080", 16 * gib, 960 * gbps, 225 * tf, pcie5x16},
	{"RTX 5090", 32 * gib, 1792 * gbps, 419 * tf, pcie5x16},
	{"L4", 24 * gib, 300 * gbps, 121 * tf, pcie4x16},
	{"A100 40GB", 40 * gib, 1555 * gbps, 312 * tf, pcie4x16},
	{"A100 80GB", 80 * gib, 2039 * gbps, 312 * tf, pcie4x16},
	{"H100 PCIe", 80 * gib, 2000 * gbps, 756 * tf, pcie5x16},
	{"H100 SXM", 80 * gib, 3350 * gbps, 989 * tf, pcie5x16},
	{"H200", 141 * gib, 4800 * gbps, 989 * tf, pcie5x16},
}

func cardKey(s string) string {
	return strings.NewReplacer(" ", "", "-", "", "_", "", "nvidia", "", "geforce", "").Replace(strings.ToLower(s))
}

// FindCard returns the card called name (without case, spaces or dashes;
// "rtx3060laptop", "RTX 3060 Laptop" and "3060-laptop" are one).
func FindCard(name string) (Card, error) {
	k := cardKey(name)
	var hits []Card
	for _, c := range Cards {
		ck := cardKey(c.Name)
		if ck == k || strings.TrimPrefix(ck, "rtx") == k {
			return c, nil
		}
		if k != "" && strings.Contains(ck, k) {
			hits = append(hits, c)
		}
	}
	if len(hits) == 1 {
		return hits[0], nil
	}
	var names []string
	for _, c := range Cards {
		names = append(names, c.Name)
	}
	return Card{}, fmt.Errorf("no card %q in ats's table; it knows %s (or give --gpu-vram, --gpu-bandwidth and --link-gbps)", name, strings.Join(names, ", "))
}

// CPUSpec is the CPU side of an estimate.
type CPUSpec struct {
	Cores int
	MemBW float64 // host memory bandwidth all cores reach together, bytes/s
	FLOPs float64 // FLOP/s of the quantized products on all cores
	// AttnFLOPs is the rate of attention over an F16 cache (conversions,
	// softmax, one head at a time): far below the products'.
	AttnFLOPs float64
}

// LaptopCPU is an 8-core laptop CPU with dual-channel DDR4-3200 (the
// paper's machine): about 40 GB/s reached, about 0.5 TFLOP/s in the
// quantized products.
var LaptopCPU = CPUSpec{Cores: 8, MemBW: 40 * gbps, FLOPs: 0.5 * tf, AttnFLOPs: 0.05 * tf}

// Shape is a unit as the estimate needs it: what it keeps resident, what
// a step reads and computes per token.
type Shape struct {
	Name          string
	Group         string // "expert" for MoE stacks
	Bytes         int64  // resident on the GPU: the weights, or the KV cache
	ReadBytes     int64  // read per decode step (weights; the KV cache up to the position)
	FLOPsPerToken float64
	InBytes       int64 // activations per token a switch before it moves
	Attention     bool  // an attention (the CPU computes it at AttnFLOPs)
}

// Per-op overheads of the estimate: a kernel launch on the GPU, a
// parallel op's fork and join on the CPU, a switch's fixed cost.
const (
	gpuLaunch   = 5e-6
	cpuOp       = 3e-6
	switchFixed = 15e-6
)

// Roofline estimates the decode step's units (batch 1) on cpu and card:
// each takes the longer of reading its bytes at the memory's rate and
// computing at the peak, plus a per-op overhead; a switch costs its fixed
// part and the activations over the link.
func Roofline(shapes []Shape, cpu CPUSpec, card Card) []Unit {
	units := make([]Unit, len(shapes))
	for i, s := range shapes {
		gpu := math.Max(float64(s.ReadBytes)/card.MemBW, s.FLOPsPerToken/card.FLOPs) + gpuLaunch
		rate := cpu.FLOPs
		if s.Attention && cpu.AttnFLOPs > 0 {
			rate = cpu.AttnFLOPs
		}
		c := math.Max(float64(s.ReadBytes)/cpu.MemBW, s.FLOPsPerToken/rate) + cpuOp
		sw := switchFixed + float64(s.InBytes)/card.LinkBW
		units[i] = Unit{Name: s.Name, Group: s.Group, Bytes: s.Bytes, CPU: c, GPU: gpu, ToGPU: sw, ToCPU: sw}
	}
	return units
}

// EstimateStatic places shapes for card's memory less fixed bytes (the
// context's buffers) by the roofline estimate: the same dynamic program
// as a measured plan.
func EstimateStatic(shapes []Shape, cpu CPUSpec, card Card, fixed int64) (Placement, []Unit, error) {
	units := Roofline(shapes, cpu, card)
	budget := card.VRAM - fixed
	if budget < 0 {
		return Placement{}, nil, fmt.Errorf("the %s's %d MiB do not hold the %d MiB of buffers a context needs", card.Name, card.VRAM>>20, fixed>>20)
	}
	p, err := Static(Problem{Units: units, Budget: budget, ToGPU: switchFixed, ToCPU: switchFixed})
	return p, units, err
}
