package runtime

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
)

// gpuExec runs a Program on the GPU for one Context: the activation
// buffers (Batch rows of each BufID), the KV cache and the scratch live in
// device memory; Eval uploads the token ids and the start position,
// queues the program's ops as kernels on one stream and copies back only
// the logits asked for.
//
// The ops are compiled once into steps, closures over device pointers,
// with the fusions listed at compile (gpu_compile.go). A decode step (one
// token) is captured into a CUDA graph the first time and replayed after
// that: the kernels read the position from device memory, so the same
// graph serves every position.
//
// Placement. Every op has a device (place); today all are onGPU and
// compile refuses others. Mixed placement (the planner's per-tensor
// choice) plugs in at compile: an op placed onCPU becomes a step that runs
// Context.exec on host buffers; compile tracks which device last wrote
// each buffer and inserts a transfer step (an async copy through pinned
// memory, or a kernel on mapped memory for small activations) wherever an
// op reads a buffer last written on the other device, ending fusions
// there; a layer whose attention is on the CPU keeps its KV cache on the
// host. The weight ops, the kernels and the run loop stay as they are.
type gpuExec struct {
	dev  *gpuDevice
	w    gpuWeightOps // the weight kernels (dev.w unless a test picks others)
	m    *Model
	gm   *gpuModel
	prog *Program
	opt  ContextOptions
	s    *cudadrv.Stream

	allocs []cudadrv.DevicePtr // freed by close

	bufs     []cudadrv.DevicePtr // by BufID: Batch rows of the width
	kvK, kvV []cudadrv.DevicePtr // by layer: CtxSize rows of f16
	in       *cudadrv.HostMem    // pinned: int32 pos0, then the batch's token ids
	dIn      cudadrv.DevicePtr   // the same on the device
	logits   *cudadrv.HostMem    // pinned: one row of logits
	scratch  cudadrv.DevicePtr   // the weight ops' (quantized activations)
	act      cudadrv.DevicePtr   // a group's input in the weight kernels' format

	moe struct { // MoE intermediates, sized for the largest MoE op
		probs, ids, weights, gate, up, down cudadrv.DevicePtr
	}
	attn struct { // split-K decode attention
		splits, chunk int
		part, ml      cudadrv.DevicePtr
	}

	place []device // by op
	steps []gpuStep
	graph *cudadrv.GraphExec // the decode step, captured on first use
	prof  *gpuProfile        // EnvGPUProfile
}

// device is where an op runs.
type device uint8

const (
	onGPU device = iota
	onCPU
)

// gpuStep is one launch group of the compiled program.
type gpuStep struct {
	name   string // op kinds it runs, for errors
	op     int    // index of its first op
	output bool   // part of the output head
	run    func(s *cudadrv.Stream, n int) error

	out   BufID     // with link: the buffer the step writes for the next
	link  *q8Link   // set on steps that can also write their output as Q8_1
	group *gpuGroup // set on matrix-product groups
}

// outputMode says which rows of logits a run computes.
type outputMode uint8

const (
	outputNone outputMode = iota // none: a prompt chunk before the last
	outputLast                   // the last token's
	outputAll                    // every token's
)

// EnvGPUGraphs set to "0" turns off the CUDA graph of the decode step (every
// launch is then queued one by one), for profiling and debugging.
const EnvGPUGraphs = "ATS_GPU_GRAPHS"

// gpuBufSpec is one device allocation of a context.
type gpuBufSpec struct {
	name  string
	bytes int64
	dst   *cudadrv.DevicePtr
}

// layout lists the device buffers of a context; newGPUExec allocates them
// and gpuMemoryNeed sums them. g's pointers are the destinations.
func (g *gpuExec) layout(dev *gpuDevice, w gpuWeightOps, p *Program, opt ContextOptions) []gpuBufSpec {
	var specs []gpuBufSpec
	add := func(name string, bytes int64, dst *cudadrv.DevicePtr) {
		if bytes > 0 {
			specs = append(specs, gpuBufSpec{name, bytes, dst})
		}
	}
	B := int64(opt.Batch)
	g.bufs = make([]cudadrv.DevicePtr, len(p.Bufs))
	for i, b := range p.Bufs {
		add("buffer "+b.Name, 4*B*int64(b.Width), &g.bufs[i])
	}
	add("input", 4*(1+B), &g.dIn)
	g.kvK = make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	g.kvV = make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	var scratch, act, probs, ids, slots, slotsOut int64
	kvSeen := map[int]bool{}
	// The weight kernels switch paths with the batch size (matrix-vector up
	// to a few tokens, tensor cores above): size the scratch for the
	// largest batch of each.
	sizes := []int{1, min(opt.Batch, kernels.MatVecMaxTokens), opt.Batch}
	for i := range p.Ops {
		op := &p.Ops[i]
		switch op.Kind {
		case OpAttention:
			a := op.Attn
			if !kvSeen[op.Layer] {
				kvSeen[op.Layer] = true
				kv := 2 * int64(opt.CtxSize) * int64(a.NKVHeads*a.HeadSize) // f16
				add(fmt.Sprintf("layer %d keys", op.Layer), kv, &g.kvK[op.Layer])
				add(fmt.Sprintf("layer %d values", op.Layer), kv, &g.kvV[op.Layer])
			}
			splits, chunk := kernels.DecodeSplits(opt.CtxSize, a.NKVHeads, dev.info.Multiprocessors)
			if splits > 1 && splits >= g.attn.splits {
				g.attn.splits, g.attn.chunk = splits, chunk
			}
		case OpMatMul:
			m := matOf(op.W, 0)
			for _, n := range sizes {
				scratch = max(scratch, int64(w.ScratchBytes(&m, n)))
				if p, ok := w.(gpuPreparedOps); ok {
					act = max(act, int64(p.InputBytes(p.InputFormat(&m, n), n, m.Cols)))
				}
			}
		case OpMoE:
			k := int64(op.TopK)
			gate, down := matOf(op.Gate, 0), matOf(op.Down, 0)
			router := matOf(op.W, 0)
			for _, n := range sizes {
				scratch = max(scratch,
					int64(w.ScratchBytes(&router, n)),
					int64(w.MoEScratchBytes(&gate, n, op.TopK, false)),
					int64(w.MoEScratchBytes(&down, n, op.TopK, true)))
			}
			if p, ok := w.(gpuPreparedOps); ok {
				// Decode's Q8_1 inputs of gate/up and of down (gpu_compile.go).
				nq := min(opt.Batch, kernels.MoEMatVecMaxTokens)
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
	if g.attn.splits > 1 {
		var part, ml int
		for i := range p.Ops {
			if a := p.Ops[i].Attn; a != nil {
				pb, mb := kernels.AttnScratch(1, a.NHeads, a.HeadSize, g.attn.splits)
				part, ml = max(part, pb), max(ml, mb)
			}
		}
		add("attention partials", int64(part), &g.attn.part)
		add("attention maxima", int64(ml), &g.attn.ml)
	}
	return specs
}

// gpuMemoryNeed is the device memory a context of m would take, the
// weights included unless another context already holds them.
func gpuMemoryNeed(dev *gpuDevice, m *Model, opt ContextOptions) int64 {
	var n int64
	w := dev.weights()
	for _, s := range (&gpuExec{}).layout(dev, w, m.Prog, opt) {
		n += gpuAlign(s.bytes)
	}
	gpuModels.Lock()
	held := gpuModels.m[gpuModelKey{m, w}] != nil
	gpuModels.Unlock()
	if !held {
		n += weightBytes(w, m.Prog)
	}
	return n
}

// newGPUExec uploads m's weights (unless a context already did), allocates
// the context's buffers and compiles the program.
func newGPUExec(dev *gpuDevice, w gpuWeightOps, m *Model, opt ContextOptions) (g *gpuExec, err error) {
	if opt.CtxSize >= 1<<31-1 {
		return nil, fmt.Errorf("gpu: context size %d too large", opt.CtxSize)
	}
	g = &gpuExec{dev: dev, w: w, m: m, prog: m.Prog, opt: opt}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	specs := g.layout(dev, w, m.Prog, opt)
	if g.gm, err = acquireGPUModel(dev, w, m); err != nil {
		return nil, err
	}
	for _, s := range specs {
		p, err := dev.ctx.Alloc(int(s.bytes))
		if err != nil {
			return nil, fmt.Errorf("gpu: %s (%d bytes): %w", s.name, s.bytes, err)
		}
		g.allocs = append(g.allocs, p)
		*s.dst = p
	}
	if g.in, err = dev.ctx.HostAlloc(4*(1+opt.Batch), cudadrv.HostAllocPortable); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if g.logits, err = dev.ctx.HostAlloc(4*m.Prog.Hyper.NVocab, cudadrv.HostAllocPortable); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if g.s, err = dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	g.prof = newGPUProfile()
	g.place = make([]device, len(m.Prog.Ops)) // all onGPU
	if err := g.compile(); err != nil {
		return nil, err
	}
	return g, nil
}

// close frees what the context holds on the device.
func (g *gpuExec) close() error {
	var errs []error
	if g.s != nil {
		errs = append(errs, g.s.Synchronize())
	}
	if g.prof != nil {
		g.prof.report(os.Stderr)
		g.prof.close()
		g.prof = nil
	}
	errs = append(errs, g.graph.Destroy(), g.s.Destroy())
	for _, p := range g.allocs {
		errs = append(errs, g.dev.ctx.Free(p))
	}
	g.allocs = nil
	if g.in != nil {
		errs = append(errs, g.in.Free())
	}
	if g.logits != nil {
		errs = append(errs, g.logits.Free())
	}
	if g.gm != nil {
		errs = append(errs, releaseGPUModel(g.dev, g.w, g.m))
		g.gm = nil
	}
	return errors.Join(errs...)
}

// eval is Context.Eval on the GPU: tokens are valid and fit the cache.
func (g *gpuExec) eval(c *Context, tokens []int, all bool) ([]float32, error) {
	nv := g.prog.Hyper.NVocab
	var out []float32
	for start := 0; start < len(tokens); start += g.opt.Batch {
		chunk := tokens[start:min(len(tokens), start+g.opt.Batch)]
		last := start+len(chunk) == len(tokens)
		mode := outputLast
		switch {
		case all:
			mode = outputAll
		case !last:
			mode = outputNone // nobody reads these logits: skip the output head
		}
		rows, err := g.run(chunk, c.pos, mode)
		if err != nil {
			return nil, err
		}
		c.pos += len(chunk)
		switch {
		case rows == 1:
			out = append(out, unsafe.Slice((*float32)(g.logits.Pointer()), nv)...)
		case rows > 1:
			l := make([]float32, rows*nv)
			if err := g.dev.ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&l[0])), 4*len(l)), g.bufs[g.prog.Logits]); err != nil {
				return nil, fmt.Errorf("gpu: reading logits: %w", err)
			}
			out = append(out, l...)
		}
	}
	return out, nil
}

// run computes one batch and waits for it. It returns the rows of logits
// computed: 0, 1 (in g.logits) or len(tokens) (in the logits buffer).
func (g *gpuExec) run(tokens []int, pos0 int, mode outputMode) (int, error) {
	n := len(tokens)
	in := unsafe.Slice((*int32)(g.in.Pointer()), 1+g.opt.Batch)
	in[0] = int32(pos0)
	for i, t := range tokens {
		in[1+i] = int32(t)
	}
	rows := 0
	start := time.Now()
	if n == 1 && mode != outputNone && g.prof == nil && os.Getenv(EnvGPUGraphs) != "0" {
		if g.graph == nil {
			if err := g.capture(); err != nil {
				return 0, err
			}
		}
		if err := g.graph.Launch(g.s); err != nil {
			return 0, fmt.Errorf("gpu: decode graph: %w", err)
		}
		rows = 1
	} else {
		var err error
		if rows, err = g.queue(n, mode); err != nil {
			return 0, err
		}
	}
	if err := g.s.Synchronize(); err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	if g.prof != nil {
		if err := g.prof.collect(n, time.Since(start)); err != nil {
			return 0, fmt.Errorf("gpu: profile: %w", err)
		}
	}
	return rows, nil
}

// queue queues a whole batch: the input upload, the steps, and the copy of
// a single row of logits to g.logits.
func (g *gpuExec) queue(n int, mode outputMode) (int, error) {
	s := g.s
	if g.prof != nil {
		// Hold the device while the host queues the run, so the events
		// time the kernels rather than the launch rate (see gpu_profile.go).
		if err := g.dev.util.Spin(s, profileSpinCycles); err != nil {
			return 0, err
		}
	}
	if err := s.CopyHtoD(g.dIn, g.in.Bytes()[:4*(1+n)]); err != nil {
		return 0, fmt.Errorf("gpu: input: %w", err)
	}
	rows := n
	for i := range g.steps {
		st := &g.steps[i]
		if st.output {
			if mode == outputNone {
				rows = 0 // the output head is the program's tail
				break
			}
			if mode == outputLast && rows > 1 {
				// Only the last token's logits are wanted: move its row first.
				in := g.prog.Ops[st.op].In
				w := 4 * g.prog.Bufs[in].Width
				if err := s.CopyDtoD(g.bufs[in], g.bufs[in].Add((rows-1)*w), w); err != nil {
					return 0, fmt.Errorf("gpu: %w", err)
				}
				rows = 1
			}
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
	if rows == 1 {
		nv := g.prog.Hyper.NVocab
		if err := s.CopyDtoH(g.logits.Bytes()[:4*nv], g.bufs[g.prog.Logits]); err != nil {
			return 0, fmt.Errorf("gpu: logits: %w", err)
		}
	}
	return rows, nil
}

// capture records the decode step (one token, its logits) into g.graph.
func (g *gpuExec) capture() error {
	graph, err := g.s.Capture(cudadrv.CaptureRelaxed, func() error {
		_, err := g.queue(1, outputLast)
		return err
	})
	if err != nil {
		return fmt.Errorf("gpu: capturing the decode step: %w", err)
	}
	defer graph.Destroy()
	if g.graph, err = graph.Instantiate(0); err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	return nil
}
