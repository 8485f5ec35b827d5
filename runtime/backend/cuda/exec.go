package cuda

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// Exec is the GPU side of one context. It holds, in one device arena, the
// activation buffers of the ops that may run here (Batch rows each), the
// KV caches of the layers whose attention runs here, the weight kernels'
// scratch and the staging ring; the resident weights live in a weight set
// shared with the model's other contexts (weights.go).
//
// The executor hands it segments: runs of consecutive ops placed on the
// GPU, each with the activation buffers that cross into it (from the CPU
// backend's mapped pinned memory) and out of it. Compile turns a
// schedule's segments into steps, closures over device pointers with the
// fusions of compile.go; Run queues one segment on the compute stream,
// transfers included, or replays its CUDA graph for a decode step.
//
// Weights that are not resident stream through the staging ring (see
// streamer): the copy stream uploads them, as far ahead as the ring holds,
// while the compute stream multiplies with those already there; events
// order the two.
type Exec struct {
	dev  *Device
	w    WeightOps
	prog *ir.Program
	cfg  backend.ExecConfig
	host backend.Host // the host's share of split expert layers (nil: no splits)
	// batch is the current step's (Begin).
	batch *ir.Batch
	s     *cudadrv.Stream // compute: kernels and the zero-copy transfers
	cs    *cudadrv.Stream // copy: weights streamed into the ring

	arena cudadrv.DevicePtr // everything below but the weight set
	bytes int64             // the arena's size

	bufs     []cudadrv.DevicePtr // by BufID: Batch rows (LogitRows for the logits), 0 if unused here
	kvK, kvV []cudadrv.DevicePtr // by layer: the cache's rows (kvType), 0 where attention runs on the CPU
	kvType   kernels.KVType
	in       *cudadrv.HostMem  // pinned: the step's input (inputLayout)
	dIn      cudadrv.DevicePtr // the same on the device
	inLay    inputLayout
	kvb      kernels.Batch // the step's positions, sequences and tables, on the device
	nTok     int           // tokens of the current batch (Begin)
	plan     stepPlan      // the current step's attention launches (Begin)
	// gather is the prefill scratch: one sequence's keys and values in
	// order, f16 ([kvRows][width] each), for the prefill kernels.
	gatherK, gatherV cudadrv.DevicePtr
	logits           *cudadrv.HostMem  // pinned: one row of logits
	done             *cudadrv.HostMem  // mapped: Sync's word (nil: Sync waits in the driver)
	doneSeq          uint32            // the last value Sync had the stream write
	scratch          cudadrv.DevicePtr // the weight ops' (quantized activations)
	act              cudadrv.DevicePtr // a group's input in the weight kernels' format

	moe struct { // MoE intermediates, sized for the largest MoE op
		probs, ids, weights, gate, up, down cudadrv.DevicePtr
	}
	attn struct { // split-K decode attention
		splits, chunk int // for one decode row
		part, ml      cudadrv.DevicePtr
		count         cudadrv.DevicePtr // the splits' arrival counters, zeroed once
		countBytes    int64
	}
	st streamer

	ws      *weightSet
	resolve func(*ir.Weight) (*mat, error) // during compile: resident or streamed
	reg     *registration                  // the model file pinned for streaming (nil when nothing streams)
	prof    *profile                       // EnvGPUProfile
	timing  [2]*cudadrv.Event              // TimeRun's

	// Step measurement (Measure): an event at the start of each batch and
	// around each segment run, and the segments in order.
	measure   bool
	marks     []*cudadrv.Event
	nMarks    int
	ran       []*Segment
	hostSpans []backend.HostSpan // with measure: the batch's Times.Host

	// split: the mapped host buffers of split MoE layers (SegmentSpec.Split),
	// made by the first Compile that splits one, and the event the host
	// waits on before it computes its share.
	split struct {
		x, y, ids, weights *cudadrv.HostMem
		ready              *cudadrv.Event
		stats              backend.SplitStats
	}

	// routed: the experts that decode steps' routed layers (SplitRouted)
	// hand the device. Their weights are copied into base: gate, up and
	// down regions of most experts of at most per bytes each; ids
	// holds the slots' device ids (the index of their expert among the
	// picked, or -1) on their way to the device; copied follows the
	// weights' copies on the copy stream, done the device's products.
	// share is the device's share for steps of each size (index: rows,
	// the last for more), moved by keepPace unless cfg.RoutedFixed.
	routed struct {
		base         cudadrv.DevicePtr
		most         int
		per          [3]int64
		ids          *cudadrv.HostMem
		copied, done *cudadrv.Event
		pick         []int32
		share        [routedSizes]float64
	}

	routeInspector backend.RouteInspector // InspectRoutes; nil outside tests
	capturing      bool                   // a decode graph is being captured (capture)
	captures       int                    // graphs captured so far
}

// Captured is how many decode graphs the executor has captured: a step
// that captured some ran slower than the ones that replay them.
func (g *Exec) Captured() int { return g.captures }

// Fits says whether the schedule's streamed weights fit the ring side by
// side, so that only the first of its batches in a row copies them.
func (s *Schedule) Fits() bool { return s.fits }

// bufSpec is one carve of the arena.
type bufSpec struct {
	name  string
	bytes int64
	dst   *cudadrv.DevicePtr
}

// layout lists the arena's carves; New allocates them and Need sums
// them. g's pointers are the destinations.
func (g *Exec) layout(dev *Device, w WeightOps, p *ir.Program, cfg backend.ExecConfig) []bufSpec {
	if cfg.LogitRows <= 0 || cfg.LogitRows > cfg.Batch {
		cfg.LogitRows = cfg.Batch
	}
	g.cfg = cfg // decodeSplits reads it (Need lays out a throwaway Exec)
	var specs []bufSpec
	add := func(name string, bytes int64, dst *cudadrv.DevicePtr) {
		if bytes > 0 {
			specs = append(specs, bufSpec{name, bytes, dst})
		}
	}
	runs := func(i int) bool { return cfg.Runs != nil && cfg.Runs[i] }
	B := int64(cfg.Batch)
	used := make([]bool, len(p.Bufs))
	for i := range p.Ops {
		if runs(i) {
			for _, id := range p.Ops[i].Buffers() {
				used[id] = true
			}
		}
	}
	g.bufs = make([]cudadrv.DevicePtr, len(p.Bufs))
	for i, b := range p.Bufs {
		rows := B
		if ir.BufID(i) == p.Logits {
			rows = int64(cfg.LogitRows)
		}
		if used[i] {
			add("buffer "+b.Name, 4*rows*int64(b.Width), &g.bufs[i])
		}
	}
	g.inLay = newInputLayout(cfg)
	add("input", 4*int64(g.inLay.words), &g.dIn)
	g.kvK = make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	g.kvV = make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	var scratch, act, probs, ids, slots, slotsOut, gatherBytes int64
	kvSeen := map[int]bool{}
	g.attn.splits = 0
	// The weight kernels switch paths with the batch size (matrix-vector up
	// to a few tokens, tensor cores above): size the scratch for the
	// largest batch of each.
	sizes := []int{1, min(cfg.Batch, kernels.MatVecMaxTokens), min(cfg.Batch, kernels.MatVecQ8_1MaxTokens), cfg.Batch}
	for i := range p.Ops {
		if !runs(i) {
			continue
		}
		op := &p.Ops[i]
		switch op.Kind {
		case ir.OpAttention:
			a := op.Attn
			if !kvSeen[op.Layer] {
				kvSeen[op.Layer] = true
				kv := cfg.KV.Type.RowBytes(a.KVWidth()) * int64(cfg.KV.Rows)
				add(fmt.Sprintf("layer %d keys", op.Layer), kv, &g.kvK[op.Layer])
				add(fmt.Sprintf("layer %d values", op.Layer), kv, &g.kvV[op.Layer])
				gatherBytes = max(gatherBytes, 2*int64(cfg.KV.Rows)*int64(a.KVWidth()))
			}
			warps := 4
			if dev.attn != nil {
				kvt, _ := kernelKVType(cfg.KV.Type)
				warps = dev.attn.DecodeWarps(a.HeadSize, a.NHeads, a.NKVHeads, kvt)
			}
			splits, chunk := kernels.DecodeSplits(cfg.KV.Rows, a.NKVHeads, warps, dev.info.Multiprocessors)
			if splits > 1 && splits >= g.attn.splits {
				g.attn.splits, g.attn.chunk = splits, chunk
			}
		case ir.OpMatMul:
			m := matOf(op.W, 0)
			rows := sizes
			if op.Out == p.Logits {
				rows = []int{1, min(cfg.LogitRows, kernels.MatVecMaxTokens), min(cfg.LogitRows, kernels.MatVecQ8_1MaxTokens), cfg.LogitRows}
			}
			for _, n := range rows {
				scratch = max(scratch, int64(w.ScratchBytes(&m, n)))
				if p, ok := w.(preparedOps); ok {
					for _, decode := range []bool{false, true} {
						act = max(act, int64(p.InputBytes(p.InputFormat(&m, n, decode), n, m.Cols)))
					}
				}
			}
		case ir.OpMoE:
			k := int64(op.TopK)
			gate, down := matOf(op.Gate, 0), matOf(op.Down, 0)
			router := matOf(op.W, 0)
			for _, n := range sizes {
				scratch = max(scratch,
					int64(w.ScratchBytes(&router, n)),
					int64(w.MoEScratchBytes(&gate, n, op.TopK, false)),
					int64(w.MoEScratchBytes(&down, n, op.TopK, true)))
			}
			if p, ok := w.(preparedOps); ok {
				// Decode's Q8_1 inputs of gate/up and of down (compile.go).
				nq := min(cfg.Batch, kernels.MoEMatVecMaxTokens)
				act = max(act, int64(p.InputBytes(actQ8_1, nq, gate.Cols)), int64(p.InputBytes(actQ8_1, nq*op.TopK, down.Cols)))
			}
			probs = max(probs, B*int64(router.Rows))
			ids = max(ids, B*k)
			slots = max(slots, B*k*int64(gate.Rows))
			slotsOut = max(slotsOut, B*k*int64(down.Rows))
		}
	}
	add("weight scratch", scratch, &g.scratch)
	add("prepared activations", act, &g.act)
	add("moe probabilities", 4*probs, &g.moe.probs)
	add("moe ids", 4*ids, &g.moe.ids)
	add("moe weights", 4*ids, &g.moe.weights)
	add("moe gate", 4*slots, &g.moe.gate)
	add("moe up", 4*slots, &g.moe.up)
	add("moe down", 4*slotsOut, &g.moe.down)
	add("prefill gather, keys", gatherBytes, &g.gatherK)
	add("prefill gather, values", gatherBytes, &g.gatherV)
	if g.attn.splits > 1 {
		var part, ml, count int
		for i := range p.Ops {
			if a := p.Ops[i].Attn; a != nil && runs(i) {
				for n := 1; n <= cfg.LogitRows; n++ {
					splits, _ := g.decodeSplits(n)
					pb, mb := kernels.AttnScratch(n, a.NHeads, a.HeadSize, splits)
					part, ml = max(part, pb), max(ml, mb)
					count = max(count, kernels.DecodeCounters(n, a.NHeads))
				}
			}
		}
		add("attention partials", int64(part), &g.attn.part)
		add("attention maxima", int64(ml), &g.attn.ml)
		add("attention merge counters", int64(count), &g.attn.count)
		g.attn.countBytes = int64(count)
	}
	if ring := ringBytes(w, p, cfg.Streams, cfg.RingBytes); ring > 0 {
		g.st.bytes = ring
		add("staging ring", ring, &g.st.base)
	}
	g.routed.most, g.routed.per = 0, [3]int64{}
	if cfg.RoutedExperts > 0 {
		for i := range p.Ops {
			if op := &p.Ops[i]; runs(i) && op.Kind == ir.OpMoE && cfg.Streams[op.Gate] {
				ne := int64(op.Gate.Experts())
				for j, wt := range []*ir.Weight{op.Gate, op.Up, op.Down} {
					g.routed.per[j] = max(g.routed.per[j], w.DeviceBytes(wt)/ne)
				}
			}
		}
		if b := g.routed.per[0] + g.routed.per[1] + g.routed.per[2]; b > 0 {
			g.routed.most = cfg.RoutedExperts
			for i := range g.routed.share {
				g.routed.share[i] = cfg.RoutedShare
			}
			add("routed experts", b*int64(cfg.RoutedExperts)+2*256, &g.routed.base)
		}
	}
	return specs
}

// RingBytes is the size of the staging ring of an Exec of cfg: at least
// twice the largest matrix that may stream (one uploading while the other
// is read), or cfg.RingBytes when that is more; 0 when nothing streams.
func (d *Device) RingBytes(p *ir.Program, cfg backend.ExecConfig) int64 {
	return ringBytes(d.Weights(cfg.Options), p, cfg.Streams, cfg.RingBytes)
}

func ringBytes(w WeightOps, p *ir.Program, streams map[*ir.Weight]bool, want int64) int64 {
	var n int64
	for _, wt := range programWeights(p) {
		if !isVector(wt) && streams[wt] {
			n = max(n, align(w.DeviceBytes(wt)))
		}
	}
	if n == 0 {
		return 0
	}
	return align(max(2*n, want))
}

// AllocGranularity is what the driver rounds a device allocation up to:
// budgets count allocations at that size.
const AllocGranularity = 2 << 20

func roundAlloc(n int64) int64 {
	return (n + AllocGranularity - 1) / AllocGranularity * AllocGranularity
}

// Need is the device memory an Exec of cfg would allocate, at the
// driver's granularity: its arena (activations, KV caches, scratch, ring)
// and the weight set, the latter zero when another Exec holds the same set
// already.
func (d *Device) Need(p *ir.Program, cfg backend.ExecConfig) (arena, weights int64) {
	w := d.Weights(cfg.Options)
	for _, s := range (&Exec{}).layout(d, w, p, cfg) {
		arena += align(s.bytes)
	}
	weightSets.Lock()
	held := weightSets.m[weightSetKey{p, w, residentKey(p, cfg.Resident)}] != nil
	weightSets.Unlock()
	if !held {
		weights = roundAlloc(setBytes(w, p, cfg.Resident))
	}
	return roundAlloc(arena), weights
}

// NewExec uploads the resident weights (unless an Exec of the program
// already did), carves the arena and makes the streams. host computes the
// host's share of split expert layers (nil when nothing splits).
func (d *Device) NewExec(p *ir.Program, cfg backend.ExecConfig, host backend.Host) (backend.Exec, error) {
	g, err := d.newExec(p, cfg, host)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (d *Device) newExec(p *ir.Program, cfg backend.ExecConfig, host backend.Host) (g *Exec, err error) {
	if cfg.KV.Rows >= 1<<31-1 {
		return nil, fmt.Errorf("gpu: a cache of %d rows is too large", cfg.KV.Rows)
	}
	if !d.SupportsKV(cfg.KV.Type) && cfg.Runs != nil && hasAttention(p, cfg.Runs) {
		return nil, fmt.Errorf("gpu: a %s KV cache is not supported by this build's GPU attention", cfg.KV.Type)
	}
	if cfg.KV.Type.Quantized() && cfg.Runs != nil {
		for i := range p.Ops {
			if a := p.Ops[i].Attn; a != nil && cfg.Runs[i] && a.KVWidth()%32 != 0 {
				return nil, fmt.Errorf("gpu: a %s KV cache needs rows of whole blocks of 32 values; layer %d's are %d", cfg.KV.Type, p.Ops[i].Layer, a.KVWidth())
			}
		}
	}
	if cfg.LogitRows <= 0 || cfg.LogitRows > cfg.Batch {
		cfg.LogitRows = cfg.Batch
	}
	dev, w := d, d.Weights(cfg.Options)
	g = &Exec{dev: dev, w: w, prog: p, cfg: cfg, host: host}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	specs := g.layout(dev, w, p, cfg)
	if g.ws, err = acquireWeights(dev, w, p, cfg.Resident, cfg.Files, cfg.Options); err != nil {
		return nil, err
	}
	if g.st.bytes > 0 {
		// Pinned for the context's life, after the upload (which pins the
		// whole file while it copies): every streamed copy reads these
		// pages, and only these.
		g.reg, _ = registerFiles(dev, streamedParts(cfg.Files, p, cfg.Streams, cfg.Resident), true, cfg.Options)
	}
	for _, s := range specs {
		g.bytes += align(s.bytes)
	}
	if g.arena, err = dev.ctx.Alloc(int(max(g.bytes, 256))); err != nil {
		return nil, fmt.Errorf("gpu: activations, KV cache and scratch (%.2f GiB): %w", float64(g.bytes)/(1<<30), err)
	}
	off := int64(0)
	for _, s := range specs {
		*s.dst = g.arena.Add(int(off))
		off += align(s.bytes)
	}
	if g.attn.count != 0 {
		// The decode kernels leave their counters zero; they start so.
		if err := dev.ctx.MemsetD32(g.attn.count, 0, int(g.attn.countBytes/4)); err != nil {
			return nil, fmt.Errorf("gpu: attention merge counters: %w", err)
		}
	}
	g.kvType, _ = kernelKVType(cfg.KV.Type)
	g.kvb = kernels.Batch{Pos: g.dIn.Add(4 * g.inLay.pos), Seq: g.dIn.Add(4 * g.inLay.seq), Tables: g.dIn.Add(4 * g.inLay.tables),
		MaxBlocks: g.inLay.maxBlocks, Block: kvcache.DefaultBlock}
	if g.in, err = dev.ctx.HostAlloc(4*g.inLay.words, cudadrv.HostAllocPortable); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	// Pinned rows for every logits row a step can want: the step's stream
	// copies them out at full speed, inside a decode graph too.
	if g.logits, err = dev.ctx.HostAlloc(4*p.Hyper.NVocab*max(cfg.LogitRows, 1), cudadrv.HostAllocPortable); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if g.s, err = dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	g.s.SetProgrammatic(!cfg.Options.NoPDL)
	if !cfg.Options.NoSpinSync {
		g.done = g.spinWord()
	}
	g.st.prefetch = !cfg.Options.NoPrefetch
	if g.st.bytes > 0 {
		if g.cs, err = dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0); err != nil {
			return nil, fmt.Errorf("gpu: %w", err)
		}
	}
	if cfg.Options.Profile {
		g.prof = newProfile()
	}
	return g, nil
}

// hasAttention says whether an op that runs is attention.
func hasAttention(p *ir.Program, runs []bool) bool {
	for i := range p.Ops {
		if runs[i] && p.Ops[i].Kind == ir.OpAttention {
			return true
		}
	}
	return false
}

// Bytes is the device memory the Exec allocated itself (the arena), and
// that of the weight set it shares.
func (g *Exec) Bytes() (arena, weights int64) {
	if g.ws != nil {
		weights = roundAlloc(g.ws.bytes)
	}
	return roundAlloc(g.bytes), weights
}

// Pinned says whether streamed weights are read from page-locked memory,
// the registered file or (copied > 0) pinned copies of the parts the
// driver would not register, and why a part is not registered.
func (g *Exec) Pinned() (ok bool, copied int64, why string) {
	if g.reg == nil {
		return false, 0, "nothing streams"
	}
	return g.reg.Pinned, g.reg.Copied, g.reg.Why
}

// Close frees what the Exec holds on the device.
func (g *Exec) Close() error {
	var errs []error
	if g.s != nil {
		errs = append(errs, g.s.Synchronize())
	}
	if g.cs != nil {
		errs = append(errs, g.cs.Synchronize())
	}
	if g.prof != nil {
		var b strings.Builder
		g.prof.report(&b)
		g.cfg.Options.Notes.Note(strings.TrimRight(b.String(), "\n"))
		g.prof.close()
		g.prof = nil
	}
	for _, set := range g.st.sets {
		for k := range set.copied {
			errs = append(errs, set.copied[k].Destroy(), set.used[k].Destroy(), set.started[k].Destroy())
		}
	}
	for _, e := range append(g.timing[:], g.marks...) {
		errs = append(errs, e.Destroy())
	}
	errs = append(errs, g.s.Destroy(), g.cs.Destroy())
	if g.arena != 0 {
		errs = append(errs, g.dev.ctx.Free(g.arena))
		g.arena = 0
	}
	if g.in != nil {
		errs = append(errs, g.in.Free())
	}
	if g.logits != nil {
		errs = append(errs, g.logits.Free())
	}
	if g.done != nil {
		errs = append(errs, g.done.Free())
	}
	for _, h := range []*cudadrv.HostMem{g.split.x, g.split.y, g.split.ids, g.split.weights} {
		if h != nil {
			errs = append(errs, h.Free())
		}
	}
	if g.split.ready != nil {
		errs = append(errs, g.split.ready.Destroy())
	}
	if g.routed.ids != nil {
		errs = append(errs, g.routed.ids.Free())
	}
	for _, e := range []*cudadrv.Event{g.routed.copied, g.routed.done} {
		if e != nil {
			errs = append(errs, e.Destroy())
		}
	}
	if g.ws != nil {
		errs = append(errs, releaseWeights(g.dev, g.ws))
		g.ws = nil
	}
	g.reg.release()
	return errors.Join(errs...)
}

// HostBuffer allocates n floats of mapped pinned host memory: the CPU
// backend computes in it, and transfer kernels read and write it through
// its device address.
func (d *Device) HostBuffer(n int) (backend.HostBuffer, error) {
	h, err := d.hostMem(n)
	if err != nil {
		return nil, err
	}
	return hostBuffer{h, n}, nil
}

func (d *Device) hostMem(n int) (*cudadrv.HostMem, error) {
	return d.ctx.HostAlloc(4*max(n, 1), cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
}

// hostBuffer is mapped pinned memory of n floats.
type hostBuffer struct {
	*cudadrv.HostMem
	n int
}

func (h hostBuffer) Floats() []float32 { return unsafe.Slice((*float32)(h.Pointer()), h.n) }
func (h hostBuffer) DevicePtr() uint64 { return uint64(h.HostMem.DevicePtr()) }

// SplitStats reports the expert layers split with the host so far.
func (g *Exec) Split() backend.SplitStats { return g.split.stats }

// Segment is a compiled SegmentSpec.
type Segment struct {
	backend.SegmentSpec
	first  bool // uploads the batch's position and token ids
	steps  []step
	graphs map[graphKey]*cudadrv.GraphExec // decode steps: captured on first use
	// graphable: nothing streams in the segment (a graph replays fixed
	// pointers, and streaming needs the copy stream's events). A segment
	// that streams replays a graph too in a batch that found its weights
	// in the ring (streamer.kept): their addresses are the layout's, and
	// nothing is copied.
	graphable bool
	streamed  []string // the weights it streams, for traces
}

// Schedule is the GPU segments of one executor schedule, and the weights
// that stream, in the order the segments use them.
type Schedule struct {
	Segs     []*Segment
	streamed []*mat
	waitFor  []int // ringLayout's
	lastUse  []int
	// fits: the streamed weights fit the ring side by side, so after a
	// batch has uploaded them they stay there, and the next batch of the
	// same schedule (no other schedule having streamed in between) finds
	// them in place and copies nothing.
	fits bool
}

// Spec is the segment's spec.
func (seg *Segment) Spec() backend.SegmentSpec { return seg.SegmentSpec }

// Segments are the schedule's segments.
func (s *Schedule) Segments() []backend.Segment {
	out := make([]backend.Segment, len(s.Segs))
	for i, seg := range s.Segs {
		out[i] = seg
	}
	return out
}

// Compile compiles the segments of a schedule; streams says which
// non-resident matrices its segments stream through the ring.
func (g *Exec) Compile(specs []backend.SegmentSpec, streams map[*ir.Weight]bool) (backend.Schedule, error) {
	return g.compileSchedule(specs, streams)
}

func (g *Exec) compileSchedule(specs []backend.SegmentSpec, streams map[*ir.Weight]bool) (*Schedule, error) {
	sch := &Schedule{}
	for i, spec := range specs {
		seg := &Segment{SegmentSpec: spec, first: i == 0}
		before := len(sch.streamed)
		skip, routed, err := g.splitSkips(spec)
		if err != nil {
			return nil, err
		}
		steps, err := g.compile(spec.Lo, spec.Hi, func(w *ir.Weight) (*mat, error) {
			if m := g.ws.mats[w]; m != nil {
				return m, nil
			}
			if routed[w] {
				m := matOf(w, 0) // moeRouted copies the experts it takes
				return &m, nil
			}
			if !streams[w] || g.st.bytes == 0 {
				return nil, fmt.Errorf("weight %q is neither resident nor streamed", w.Name)
			}
			m := matOf(w, 0) // the ring address comes with the layout below
			m.seq, m.skip = len(sch.streamed), skip[w]
			sch.streamed = append(sch.streamed, &m)
			return &m, nil
		}, spec.Split)
		if err != nil {
			return nil, err
		}
		seg.steps = steps
		seg.graphable = len(sch.streamed) == before && len(spec.Split) == 0
		for _, m := range sch.streamed[before:] {
			seg.streamed = append(seg.streamed, m.W.Name)
		}
		sch.Segs = append(sch.Segs, seg)
	}
	var err error
	if sch.waitFor, sch.lastUse, sch.fits, err = g.ringLayout(sch.streamed); err != nil {
		return nil, err
	}
	return sch, nil
}

// splitSkips checks a segment's split MoE ops (SegmentSpec.Split) and
// returns, for each of their expert stacks, the bytes of the experts the
// host computes (mat.skip), and the expert stacks of routed ops
// (SplitRouted), and makes the host buffers they need.
func (g *Exec) splitSkips(spec backend.SegmentSpec) (skip map[*ir.Weight]int64, routed map[*ir.Weight]bool, err error) {
	if len(spec.Split) == 0 {
		return nil, nil, nil
	}
	if !SplitsMoE(g.w) {
		return nil, nil, fmt.Errorf("gpu: a split MoE layer needs the quantized weight path (the experts in the file's layout), not %s", g.w.Name())
	}
	if g.host == nil {
		return nil, nil, errors.New("gpu: a split MoE layer without a host to compute its share")
	}
	skip, routed = map[*ir.Weight]int64{}, map[*ir.Weight]bool{}
	emb, k := 0, 0
	for i, ks := range spec.Split {
		if i < spec.Lo || i >= spec.Hi || g.prog.Ops[i].Kind != ir.OpMoE {
			return nil, nil, fmt.Errorf("gpu: split of op %d, not an MoE op of the segment %d-%d", i, spec.Lo, spec.Hi)
		}
		op := &g.prog.Ops[i]
		ne := op.Gate.Experts()
		emb, k = max(emb, op.Gate.Cols()), max(k, op.TopK)
		if ks == backend.SplitRouted {
			if g.routed.most == 0 || g.cs == nil {
				return nil, nil, fmt.Errorf("gpu: MoE layer %d is routed, but the context has no scratch for routed experts (ExecConfig.RoutedExperts) or copy stream", op.Layer)
			}
			for j, w := range []*ir.Weight{op.Gate, op.Up, op.Down} {
				if b := g.w.DeviceBytes(w) / int64(ne); b > g.routed.per[j] || int64(len(w.Data)) != g.w.DeviceBytes(w) {
					return nil, nil, fmt.Errorf("gpu: MoE layer %d's %s: an expert of %d bytes (%d in the file) for a routed scratch of %d", op.Layer, w.Name, b, len(w.Data)/ne, g.routed.per[j])
				}
				routed[w] = true
			}
			continue
		}
		if ks < 1 || ks >= ne {
			return nil, nil, fmt.Errorf("gpu: MoE layer %d split at expert %d of %d", op.Layer, ks, ne)
		}
		for _, w := range []*ir.Weight{op.Gate, op.Up, op.Down} {
			skip[w] = g.w.DeviceBytes(w) / int64(ne) * int64(ks)
		}
	}
	sp := &g.split
	alloc := func(h **cudadrv.HostMem, n int) error {
		if *h != nil && (*h).Len() >= 4*n {
			return nil
		}
		if *h != nil {
			if err := (*h).Free(); err != nil {
				return err
			}
		}
		var err error
		*h, err = g.dev.hostMem(n)
		return err
	}
	b := g.cfg.Batch
	if err := errors.Join(alloc(&sp.x, b*emb), alloc(&sp.y, b*emb), alloc(&sp.ids, b*k), alloc(&sp.weights, b*k)); err != nil {
		return nil, nil, fmt.Errorf("gpu: host buffers of a split MoE layer: %w", err)
	}
	if len(routed) > 0 {
		if err := alloc(&g.routed.ids, b*k); err != nil {
			return nil, nil, fmt.Errorf("gpu: host buffers of a routed MoE layer: %w", err)
		}
	}
	for _, e := range []**cudadrv.Event{&sp.ready, &g.routed.copied, &g.routed.done} {
		if *e == nil {
			ev, err := g.dev.ctx.NewEvent(cudadrv.EventDisableTiming)
			if err != nil {
				return nil, nil, fmt.Errorf("gpu: %w", err)
			}
			*e = ev
		}
	}
	return skip, routed, nil
}

// Release destroys the schedule's graphs.
func (sch *Schedule) Release() error {
	var errs []error
	for _, seg := range sch.Segs {
		for _, gr := range seg.graphs {
			errs = append(errs, gr.Destroy())
		}
		seg.graphs = nil
	}
	return errors.Join(errs...)
}

// Begin starts a step of batch b under schedule s: the position and token
// ids for the first segment to upload, and the first weights of the
// schedule on their way into the ring.
func (g *Exec) Begin(s backend.Schedule, b *ir.Batch) error {
	sch, ok := s.(*Schedule)
	if !ok {
		return fmt.Errorf("gpu: a schedule of another backend (%T)", s)
	}
	if b.Len() > g.cfg.Batch {
		return fmt.Errorf("gpu: a step of %d tokens, the buffers hold %d", b.Len(), g.cfg.Batch)
	}
	if err := g.setInput(b); err != nil {
		return err
	}
	g.batch = b
	g.nTok = b.Len()
	if g.measure {
		g.nMarks = 0
		if err := g.mark(); err != nil { // the batch's time base
			return err
		}
	}
	return g.streamBegin(sch)
}

// Run queues segment seg of the step at rows rows and returns the rows it
// leaves: the output head, when the segment has it, computes the batch's
// logits rows only (none for a chunk whose logits nobody reads). A decode
// step (one token of each of its sequences, every logit wanted) replays
// the segment's graph for its number of rows.
func (g *Exec) Run(s backend.Segment, rows int) (int, error) {
	seg, ok := s.(*Segment)
	if !ok {
		return 0, fmt.Errorf("gpu: a segment of another backend (%T)", s)
	}
	return g.run(seg, rows)
}

// graphKey tells decode graphs apart: by rows, and whether the rows are
// short (their attention's kernel; stepPlan.short).
type graphKey struct {
	rows  int
	short bool
}

func (g *Exec) run(seg *Segment, rows int) (int, error) {
	if g.measure {
		if err := g.mark(); err != nil {
			return 0, err
		}
		defer func() { _ = g.mark() }()
		g.ran = append(g.ran, seg)
	}
	b := g.batch
	if b.Decode() && b.AllLogits() && !b.Hidden && rows == b.Len() && (seg.graphable || g.st.kept && len(seg.Split) == 0) && g.prof == nil && g.routeInspector == nil && !g.cfg.Options.NoGraphs {
		key := graphKey{rows, g.plan.short}
		graph := seg.graphs[key]
		if graph == nil {
			var err error
			if graph, err = g.capture(seg, rows); err != nil {
				return 0, err
			}
			if seg.graphs == nil {
				seg.graphs = map[graphKey]*cudadrv.GraphExec{}
			}
			seg.graphs[key] = graph
		}
		if err := graph.Launch(g.s); err != nil {
			return 0, fmt.Errorf("gpu: decode graph of ops %d-%d, %d rows: %w", seg.Lo, seg.Hi, rows, err)
		}
		return rows, nil
	}
	start := time.Now()
	rows, err := g.queue(seg, rows)
	if err != nil {
		return 0, err
	}
	if g.prof != nil {
		if err := g.s.Synchronize(); err != nil {
			return 0, fmt.Errorf("gpu: %w", err)
		}
		if err := g.prof.collect(g.nTok, time.Since(start)); err != nil {
			return 0, fmt.Errorf("gpu: profile: %w", err)
		}
	}
	return rows, nil
}

// Sync waits for everything queued: the CPU may then read what the
// segments sent back. A hybrid decode step hands over between the CPU and
// the GPU dozens of times, so the hand-over's latency counts: the stream
// writes a sequence number into mapped host memory after its work, and the
// host polls that word rather than waiting in the driver. The poll asks the
// driver now and then, so that a failed stream is reported, not waited for,
// and leaves a long wait (a prefill batch) to the driver after spinLimit.
func (g *Exec) Sync() error {
	if g.done == nil || g.prof != nil {
		if err := g.s.Synchronize(); err != nil {
			return fmt.Errorf("gpu: %w", err)
		}
		return nil
	}
	g.doneSeq++
	if err := g.s.WriteValue32(g.done.DevicePtr(), g.doneSeq); err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	word := (*uint32)(g.done.Pointer())
	start := time.Now()
	for i := 1; int32(atomic.LoadUint32(word)-g.doneSeq) < 0; i++ {
		if i%4096 != 0 {
			continue
		}
		if finished, err := g.s.Done(); err != nil {
			return fmt.Errorf("gpu: %w", err)
		} else if finished {
			break
		}
		if time.Since(start) > spinLimit {
			if err := g.s.Synchronize(); err != nil {
				return fmt.Errorf("gpu: %w", err)
			}
			break
		}
	}
	return nil
}

// spinLimit is how long Sync polls before it waits in the driver: longer
// than a decode step's GPU segments, shorter than a prefill batch.
const spinLimit = 2 * time.Millisecond

// spinWord is the word Sync polls, or nil where the driver cannot write
// one (it then waits in cuStreamSynchronize).
func (g *Exec) spinWord() *cudadrv.HostMem {
	h, err := g.dev.ctx.HostAlloc(64, cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
	if err != nil {
		return nil
	}
	if err := errors.Join(g.s.WriteValue32(h.DevicePtr(), 0), g.s.Synchronize()); err != nil {
		_ = h.Free()
		return nil
	}
	return h
}

// Logits returns the step's rows rows of logits (after Sync): the pinned
// rows the segment with Logits copied out, in place (valid until the next
// step), or rows copied into dst.
func (g *Exec) Logits(dst []float32, rows int) ([]float32, error) {
	nv := g.prog.Hyper.NVocab
	if rows >= 1 && rows <= max(g.cfg.LogitRows, 1) {
		return unsafe.Slice((*float32)(g.logits.Pointer()), rows*nv), nil
	}
	if err := g.readLogits(dst[:rows*nv]); err != nil {
		return nil, err
	}
	return dst[:rows*nv], nil
}

// ReadBuffer copies the first len(dst) floats of buffer id from the device
// (after Sync): the hidden rows of a Batch.Hidden step.
func (g *Exec) ReadBuffer(id ir.BufID, dst []float32) error {
	if len(dst) == 0 {
		return nil
	}
	if err := g.dev.ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), g.bufs[id]); err != nil {
		return fmt.Errorf("gpu: reading buffer %s: %w", g.prog.Bufs[id].Name, err)
	}
	return nil
}

// readLogits copies rows of logits from the device (after Sync).
func (g *Exec) readLogits(dst []float32) error {
	if len(dst) == 0 {
		return nil
	}
	if err := g.dev.ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), g.bufs[g.prog.Logits]); err != nil {
		return fmt.Errorf("gpu: reading logits: %w", err)
	}
	return nil
}

// queue queues a segment: the input upload (first segment), the
// transfers in, the steps, the transfers out and the copy of the logits
// rows to g.logits.
func (g *Exec) queue(seg *Segment, rows int) (int, error) {
	s := g.s
	if g.prof != nil {
		// Hold the device while the host queues the run, so the events
		// time the kernels rather than the launch rate (see profile.go).
		if err := g.dev.util.Spin(s, profileSpinCycles); err != nil {
			return 0, err
		}
	}
	if seg.first {
		head, tables := g.inputBytes(len(g.batch.Tables))
		if err := s.CopyHtoD(g.dIn, head); err != nil {
			return 0, fmt.Errorf("gpu: input: %w", err)
		}
		if err := s.CopyHtoD(g.dIn.Add(4*g.inLay.tables), tables); err != nil {
			return 0, fmt.Errorf("gpu: KV tables: %w", err)
		}
	}
	for _, t := range seg.In {
		if err := g.dev.elem.CopyF32(s, g.bufs[t.Buf], cudadrv.DevicePtr(t.Host.DevicePtr()), rows*g.width(t.Buf)); err != nil {
			return 0, fmt.Errorf("gpu: buffer %s to the device: %w", g.prog.Bufs[t.Buf].Name, err)
		}
	}
	for i := range seg.steps {
		st := &seg.steps[i]
		if g.batch.Hidden && g.prog.Ops[st.op].Out == g.prog.Logits {
			break // the hidden rows are wanted, not the logits
		}
		if st.output && rows == g.batch.Len() {
			logits := g.batch.Logits
			if len(logits) == 0 {
				return 0, nil // the output head is the program's tail
			}
			// Only these rows' logits are wanted: move them first (in
			// order, so no row is overwritten before it is read).
			in := g.prog.Ops[st.op].In
			w := 4 * g.width(in)
			for k, r := range logits {
				if int(r) == k {
					continue
				}
				if err := s.CopyDtoD(g.bufs[in].Add(k*w), g.bufs[in].Add(int(r)*w), w); err != nil {
					return 0, fmt.Errorf("gpu: %w", err)
				}
			}
			rows = len(logits)
		}
		if g.prof != nil {
			if err := g.prof.mark(g.dev.ctx, s, st.name); err != nil {
				return 0, err
			}
		}
		if err := st.run(s, rows); err != nil {
			return 0, fmt.Errorf("gpu: op %d (%s, layer %d): %w", st.op, st.name, g.prog.Ops[st.op].Layer, err)
		}
	}
	if g.prof != nil {
		if err := g.prof.mark(g.dev.ctx, s, ""); err != nil {
			return 0, err
		}
	}
	for _, t := range seg.Out {
		if err := g.dev.elem.CopyF32(s, cudadrv.DevicePtr(t.Host.DevicePtr()), g.bufs[t.Buf], rows*g.width(t.Buf)); err != nil {
			return 0, fmt.Errorf("gpu: buffer %s to the host: %w", g.prog.Bufs[t.Buf].Name, err)
		}
	}
	if seg.Logits && rows >= 1 && rows <= max(g.cfg.LogitRows, 1) && !g.batch.Hidden {
		nv := g.prog.Hyper.NVocab
		if err := s.CopyDtoH(g.logits.Bytes()[:4*nv*rows], g.bufs[g.prog.Logits]); err != nil {
			return 0, fmt.Errorf("gpu: logits: %w", err)
		}
	}
	return rows, nil
}

// capture records a decode segment of rows rows (every row's logits) into
// a graph.
func (g *Exec) capture(seg *Segment, rows int) (*cudadrv.GraphExec, error) {
	moe := false
	for i := range g.prog.Ops {
		moe = moe || g.prog.Ops[i].Kind == ir.OpMoE
	}
	if err := g.dev.loadModules(moe); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	// A kept batch's streamed weights are in place: the capture leaves out
	// the waits for their uploads and the marks that free their regions
	// (the next batch that streams begins after this one has synchronised).
	g.capturing = true
	graph, err := g.s.Capture(cudadrv.CaptureRelaxed, func() error {
		_, err := g.queue(seg, rows)
		return err
	})
	g.capturing = false
	g.captures++
	if err != nil {
		return nil, fmt.Errorf("gpu: capturing the decode segment of ops %d-%d, %d rows: %w", seg.Lo, seg.Hi, rows, err)
	}
	defer graph.Destroy()
	exec, err := graph.Instantiate(0)
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	return exec, nil
}

// streamer moves non-resident weights through the staging ring, a byte
// ring in device memory: a batch's streamed weights take consecutive
// regions (wrapping at the end), and the copy stream uploads each as soon
// as the weight that last held its region has been used, so the copy
// engine runs as far ahead of the compute as the ring allows. Per weight,
// event copied orders the compute after its upload, and event used orders
// the next upload into its region after the compute that read it.
//
// A decode step's last promoted weights leave the copy engine idle for
// the rest of the step (6-7 ms of a 14B step on the GPU machine). Once a
// decode batch has queued all its uploads, the next batch of the same
// schedule's first weights go up as their regions free (prefetch): the
// next step most often runs the same plan, and finds them there. Each
// batch's events alternate between two sets, so the prefetch's do not
// overwrite those the running batch still reads (Times).
type streamer struct {
	base  cudadrv.DevicePtr
	bytes int64 // the ring's size

	sch     *Schedule
	order   []*mat // this batch's streamed weights, in order of use
	waitFor []int  // by order: the latest earlier weight whose region overlaps (-1: none)
	issued  int    // uploads queued
	done    int    // the last weight released
	// holder is the schedule whose streamed weights all sit in the ring
	// (Schedule.fits), kept says this batch found them there.
	holder *Schedule
	kept   bool
	// pre is the uploads of the next batch of schedule preFor queued
	// ahead (prefetch), their events in the other set.
	preFor *Schedule
	pre    int
	ahead  int64 // bytes of this batch's weights a prefetch queued
	// prefetched is how many of this batch's uploads (the first) a
	// prefetch queued.
	prefetched int
	// prefetch: the next decode step's first uploads may go ahead
	// (EnvGPUPrefetch).
	prefetch bool

	sets  [2]ringEvents // by batch, alternating
	par   int           // the set of the current batch
	moved atomic.Int64  // bytes uploaded since the Exec began (read by metrics)
}

// ringEvents are one batch's events of its uploads, by order.
type ringEvents struct {
	copied, used, started []*cudadrv.Event
}

// events is the current batch's set.
func (st *streamer) events() *ringEvents { return &st.sets[st.par] }

// ringLayout places a schedule's streamed weights in the ring: their
// device addresses; for each the latest earlier weight whose region it
// overlaps (waitFor), and the latest weight, itself or later, whose region
// overlaps its own (lastUse: what the next batch's upload of it waits for).
func (g *Exec) ringLayout(streamed []*mat) (waitFor, lastUse []int, fits bool, err error) {
	off := make([]int64, len(streamed))
	size := make([]int64, len(streamed))
	cursor := int64(0)
	fits = true
	for j, m := range streamed {
		b := align(g.copied(m))
		if b > g.st.bytes {
			return nil, nil, false, fmt.Errorf("weight %q (%d bytes) does not fit the staging ring of %d", m.W.Name, b, g.st.bytes)
		}
		if cursor+b > g.st.bytes {
			cursor, fits = 0, false
		}
		off[j], size[j] = cursor, b
		m.Ptr = g.st.base.Add(int(cursor - m.skip)) // the skipped experts would lie before the region
		cursor += b
	}
	overlap := func(j, k int) bool { return off[k] < off[j]+size[j] && off[j] < off[k]+size[k] }
	waitFor, lastUse = make([]int, len(streamed)), make([]int, len(streamed))
	for j := range streamed {
		waitFor[j], lastUse[j] = -1, j
		for k := j - 1; k >= 0; k-- {
			if overlap(j, k) {
				waitFor[j] = k
				break
			}
		}
		for k := len(streamed) - 1; k > j; k-- {
			if overlap(j, k) {
				lastUse[j] = k
				break
			}
		}
	}
	return waitFor, lastUse, fits, nil
}

// streamBegin starts a batch: every upload whose region is free, after
// those a prefetch queued for it.
func (g *Exec) streamBegin(sch *Schedule) error {
	st := &g.st
	pre := 0
	if st.preFor == sch {
		pre = st.pre
	}
	st.preFor, st.pre, st.ahead = nil, 0, 0
	st.sch, st.order, st.waitFor, st.issued, st.done, st.prefetched = sch, sch.streamed, sch.waitFor, pre, -1, pre
	for _, m := range st.order[:pre] {
		st.ahead += g.copied(m)
	}
	st.kept = len(sch.streamed) > 0 && sch.fits && st.holder == sch
	if st.kept {
		// Every weight is in place: the compute stream's waits for
		// their uploads find the events of the batch that made them
		// (the set stays).
		st.issued = len(st.order)
		return nil
	}
	if len(sch.streamed) > 0 {
		st.holder = nil // this batch overwrites the ring
		st.par ^= 1     // a prefetch's events are in the other set; a batch that streams nothing keeps the set a kept batch will read
	}
	if err := g.growEvents(st.events(), len(st.order)); err != nil {
		return err
	}
	if err := g.streamIssue(); err != nil {
		return err
	}
	if sch.fits && st.issued == len(st.order) {
		st.holder = sch // in place once these uploads are done
	}
	return nil
}

// growEvents makes set hold at least n uploads' events.
func (g *Exec) growEvents(set *ringEvents, n int) error {
	for len(set.copied) < n {
		var ev [3]*cudadrv.Event
		for k, flags := range []cudadrv.EventFlags{cudadrv.EventDefault, cudadrv.EventDisableTiming, cudadrv.EventDefault} {
			e, err := g.dev.ctx.NewEvent(flags)
			if err != nil {
				return fmt.Errorf("gpu: %w", err)
			}
			ev[k] = e
		}
		set.copied, set.used, set.started = append(set.copied, ev[0]), append(set.used, ev[1]), append(set.started, ev[2])
	}
	return nil
}

// streamIssue queues the uploads, in order, whose regions are free; once
// a decode batch has queued all of its own, the next batch's (prefetch).
func (g *Exec) streamIssue() error {
	st := &g.st
	ev := st.events()
	for st.issued < len(st.order) && st.waitFor[st.issued] <= st.done {
		j := st.issued
		var wait *cudadrv.Event
		if k := st.waitFor[j]; k >= 0 {
			wait = ev.used[k]
		}
		if err := g.upload(st.order[j], ev, j, wait); err != nil {
			return err
		}
		st.issued++
	}
	if st.issued < len(st.order) || !g.batch.Decode() || st.sch.fits || !st.prefetch {
		return nil
	}
	// The next batch's weights whose regions this batch has done with,
	// up to the first that must wait for the next batch's own compute.
	next := &st.sets[st.par^1]
	for st.pre < len(st.order) && st.waitFor[st.pre] < 0 && st.sch.lastUse[st.pre] <= st.done {
		j := st.pre
		if err := g.growEvents(next, j+1); err != nil {
			return err
		}
		if err := g.upload(st.order[j], next, j, ev.used[st.sch.lastUse[j]]); err != nil {
			return err
		}
		st.preFor = st.sch
		st.pre++
	}
	return nil
}

// upload queues weight m's upload into its region (order j of its batch,
// events in set), after event wait (nil: none) on the copy stream.
func (g *Exec) upload(m *mat, set *ringEvents, j int, wait *cudadrv.Event) error {
	if wait != nil {
		if err := g.cs.WaitEvent(wait); err != nil {
			return fmt.Errorf("gpu: streaming %s: %w", m.W.Name, err)
		}
	}
	if err := set.started[j].Record(g.cs); err != nil {
		return fmt.Errorf("gpu: streaming %s: %w", m.W.Name, err)
	}
	var err error
	_, raw := g.w.(*quantOps)
	switch {
	case raw && g.reg != nil && g.reg.Copied > 0:
		err = g.cs.CopyHtoD(m.Ptr.Add(int(m.skip)), g.reg.source(m.W.Data)[m.skip:]) // the file's blocks, from their pinned copy
	case raw:
		err = g.cs.CopyHtoD(m.Ptr.Add(int(m.skip)), m.W.Data[m.skip:]) // the file's blocks, as Upload copies them
	default:
		_, err = g.w.Upload(g.cs, m.W, m.Ptr) // no skip: splits need the raw path (splitSkips)
	}
	if err != nil {
		return fmt.Errorf("gpu: streaming %s: %w", m.W.Name, err)
	}
	if err := set.copied[j].Record(g.cs); err != nil {
		return fmt.Errorf("gpu: streaming %s: %w", m.W.Name, err)
	}
	g.st.moved.Add(g.copied(m))
	return nil
}

// copied is the bytes an upload of streamed weight m copies: its device
// bytes, less the host's experts of a split stack (mat.skip).
func (g *Exec) copied(m *mat) int64 { return g.w.DeviceBytes(m.W) - m.skip }

// acquire makes the compute stream wait for m's upload (resident weights:
// nothing).
func (g *Exec) acquire(s *cudadrv.Stream, m *mat) error {
	if m.seq < 0 || g.capturing {
		return nil
	}
	return s.WaitEvent(g.st.events().copied[m.seq])
}

// release marks m's region free once the compute stream passes this point,
// and queues the uploads that were waiting for it.
func (g *Exec) release(s *cudadrv.Stream, m *mat) error {
	if m.seq < 0 || g.capturing {
		return nil
	}
	if err := g.st.events().used[m.seq].Record(s); err != nil {
		return err
	}
	g.st.done = m.seq
	return g.streamIssue()
}

// Prefetched is the bytes of the current batch's streamed weights that
// the batch before queued (the prefetch of a decode step's first
// promoted weights).
func (g *Exec) Prefetched() int64 { return g.st.ahead }

// Streamed is the weight bytes streamed through the ring so far. It may be
// called from any goroutine.
func (g *Exec) Streamed() int64 { return g.st.moved.Load() }

// Measure turns on the timing of batches: events around every segment and
// every weight upload, read back by Times after Sync.
func (g *Exec) Measure(on bool) { g.measure = on }

// mark records the next timing event on the compute stream.
func (g *Exec) mark() error {
	if g.nMarks == len(g.marks) {
		e, err := g.dev.ctx.NewEvent(cudadrv.EventDefault)
		if err != nil {
			return fmt.Errorf("gpu: %w", err)
		}
		g.marks = append(g.marks, e)
	}
	if g.nMarks == 0 {
		g.ran, g.hostSpans = g.ran[:0], g.hostSpans[:0]
	}
	err := g.marks[g.nMarks].Record(g.s)
	g.nMarks++
	return err
}

// Times reads the batch's events.
func (g *Exec) Times() (backend.Times, error) {
	var t backend.Times
	if !g.measure || g.nMarks == 0 {
		return t, nil
	}
	ev := g.st.events()
	if n := g.st.issued; n > 0 && !g.st.kept {
		// The batch's last upload (the copy stream runs in order; a
		// prefetch for the next batch may follow, not waited for).
		if err := ev.copied[n-1].Synchronize(); err != nil {
			return t, fmt.Errorf("gpu: %w", err)
		}
	}
	t.Host = slices.Clone(g.hostSpans) // the next batch reuses g.hostSpans
	base := g.marks[0]
	at := func(e *cudadrv.Event) (float64, error) {
		d, err := cudadrv.Elapsed(base, e)
		return d.Seconds(), err
	}
	for k, seg := range g.ran {
		if 2+2*k >= g.nMarks {
			break
		}
		a, err := at(g.marks[1+2*k])
		if err != nil {
			return t, err
		}
		b, err := at(g.marks[2+2*k])
		if err != nil {
			return t, err
		}
		t.Segments = append(t.Segments, backend.Span{Name: fmt.Sprintf("ops %d-%d", seg.Lo, seg.Hi-1), Lo: seg.Lo, Hi: seg.Hi, Start: a, End: b, Streams: !seg.graphable})
	}
	for j := 0; j < g.st.issued && !g.st.kept; j++ {
		a, err := at(ev.started[j])
		if err == nil {
			var b float64
			if b, err = at(ev.copied[j]); err == nil {
				m := g.st.order[j]
				t.Uploads = append(t.Uploads, backend.Span{Name: m.W.Name, Start: a, End: b, Bytes: g.copied(m)})
				continue
			}
		}
		if j < g.st.prefetched {
			continue // queued in the batch before, ahead of this one's time base: the driver may not time it
		}
		return t, err
	}
	return t, nil
}
