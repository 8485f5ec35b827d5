package runtime

import (
	"errors"
	"fmt"
	"sort"

	"github.com/atsinfer/ats/ops"
)

// ContextOptions configure an inference context.
type ContextOptions struct {
	CtxSize int  // tokens the KV cache holds (0: the model's training context, at most 4096)
	KVF32   bool // keep the KV cache in f32 instead of f16
	Threads int  // CPU threads (0: all cores)
	Batch   int  // most tokens computed together in prefill (0: 512)
	// Backend is where the context computes: "cpu" (or ""), "gpu" (every
	// op on the GPU; an error when CUDA or device memory is missing) or
	// "auto" (the GPU when usable and the model fits, else the CPU, said
	// once on stderr). See gpu_backend.go.
	Backend string
}

// Context is one sequence being evaluated: KV cache, activation buffers and
// the position reached. It is not safe for concurrent use.
type Context struct {
	m       *Model
	opt     ContextOptions
	pool    *ops.Pool
	kv      []*ops.KVLayer // by layer
	bufs    [][]float32    // by BufID: Batch rows of the buffer's width
	scratch []byte         // quantized activations
	moe     moeScratch
	rope    ropeCache // rotation table of the current batch (exec.go)
	pos     int
	gpu     *gpuExec // set when the context runs on the GPU (gpu_exec.go)
}

// ErrContextFull is returned when a sequence outgrows the KV cache.
var ErrContextFull = errors.New("context is full")

// NewContext allocates a context for the model.
func (m *Model) NewContext(opt ContextOptions) (*Context, error) {
	h := m.Prog.Hyper
	if opt.CtxSize <= 0 {
		opt.CtxSize = min(h.NCtxTrain, 4096)
	}
	if opt.Batch <= 0 {
		opt.Batch = 512
	}
	opt.Batch = min(opt.Batch, opt.CtxSize)
	if err := checkContextOptions(m, opt); err != nil { // limits.go
		return nil, fmt.Errorf("%s: %w", m.File.Path, err)
	}
	c := &Context{m: m, opt: opt, pool: ops.NewPool(opt.Threads)}
	if g, err := m.newBackend(opt); err != nil || g != nil {
		if err != nil {
			c.pool.Close()
			return nil, err
		}
		c.gpu = g
		return c, nil
	}
	c.kv = make([]*ops.KVLayer, h.NLayer)
	scratch := 0
	for _, op := range m.Prog.Ops {
		switch op.Kind {
		case OpAttention:
			if c.kv[op.Layer] == nil {
				c.kv[op.Layer] = ops.NewKVLayer(opt.CtxSize, op.Attn.NKVHeads*op.Attn.HeadSize, !opt.KVF32)
			}
		case OpMatMul:
			scratch = max(scratch, op.W.Mat.ActBytes(opt.Batch))
		case OpMoE:
			scratch = max(scratch, op.W.Mat.ActBytes(opt.Batch), op.Gate.Stack[0].ActBytes(opt.Batch), op.Down.Stack[0].ActBytes(opt.Batch))
			c.moe.grow(opt.Batch, op)
		}
	}
	c.scratch = make([]byte, scratch)
	c.bufs = make([][]float32, len(m.Prog.Bufs))
	for i, b := range m.Prog.Bufs {
		c.bufs[i] = make([]float32, opt.Batch*b.Width)
	}
	return c, nil
}

// Close stops the context's worker threads and frees its GPU memory.
func (c *Context) Close() {
	c.pool.Close()
	if c.gpu != nil {
		_ = c.gpu.close()
		c.gpu = nil
	}
}

// Pos is the number of tokens in the cache.
func (c *Context) Pos() int { return c.pos }

// CtxSize is the capacity of the cache in tokens.
func (c *Context) CtxSize() int { return c.opt.CtxSize }

// Threads is the number of CPU threads the context computes on.
func (c *Context) Threads() int { return c.pool.Threads() }

// Truncate forgets every token from position n on, so a sequence sharing
// its first n tokens can continue from there.
func (c *Context) Truncate(n int) error {
	if n < 0 || n > c.pos {
		return fmt.Errorf("truncate to %d: the context holds %d tokens", n, c.pos)
	}
	c.pos = n
	return nil
}

// Eval feeds tokens at the current position and returns logits: one row of
// NVocab per token when all is set, else only the last token's row.
func (c *Context) Eval(tokens []int, all bool) ([]float32, error) {
	h := c.m.Prog.Hyper
	if err := c.checkTokens(tokens); err != nil {
		return nil, err
	}
	if c.gpu != nil {
		return c.gpu.eval(c, tokens, all)
	}
	var out []float32
	for start := 0; start < len(tokens); start += c.opt.Batch {
		chunk := tokens[start:min(len(tokens), start+c.opt.Batch)]
		last := start+len(chunk) == len(tokens)
		rows := c.run(chunk, all || !last)
		if all || last {
			out = append(out, c.bufs[c.m.Prog.Logits][:rows*h.NVocab]...)
		}
	}
	return out, nil
}

// checkTokens validates a batch for Eval: non-empty, in the vocabulary,
// and room in the cache.
func (c *Context) checkTokens(tokens []int) error {
	h := c.m.Prog.Hyper
	if len(tokens) == 0 {
		return errors.New("eval: no tokens")
	}
	for i, t := range tokens {
		if t < 0 || t >= h.NVocab {
			return fmt.Errorf("eval: token %d (at %d) is outside the vocabulary of %d", t, i, h.NVocab)
		}
	}
	if c.pos+len(tokens) > c.opt.CtxSize {
		return fmt.Errorf("%w: %d tokens in the cache + %d new > context size %d", ErrContextFull, c.pos, len(tokens), c.opt.CtxSize)
	}
	return nil
}

// EvalView is Eval for callers that read the logits before their next call:
// it returns the context's own logits buffer (the last token's row, or every
// row when all is set) instead of a copy, which saves allocating and
// copying NVocab floats per call (0.6 MB for a 152k vocabulary: with its
// page faults, milliseconds of a decode step). The next Eval or EvalView
// overwrites the slice. Batches longer than ContextOptions.Batch, and GPU
// contexts, get a copy as from Eval.
func (c *Context) EvalView(tokens []int, all bool) ([]float32, error) {
	if c.gpu != nil || len(tokens) > c.opt.Batch {
		return c.Eval(tokens, all)
	}
	if err := c.checkTokens(tokens); err != nil {
		return nil, err
	}
	rows := c.run(tokens, all)
	return c.bufs[c.m.Prog.Logits][:rows*c.m.Prog.Hyper.NVocab], nil
}

// run executes the program over one batch and returns how many rows the
// logits buffer holds (all tokens, or only the last).
func (c *Context) run(tokens []int, all bool) int {
	n := len(tokens)
	pos0 := c.pos
	prog := c.m.Prog.Ops
	for i := 0; i < len(prog); i++ {
		op := &prog[i]
		if op.Output && !all && n > 1 {
			// Only the last token's logits are wanted: move its row first.
			w := c.m.Prog.Bufs[op.In].Width
			copy(c.bufs[op.In][:w], c.bufs[op.In][(n-1)*w:n*w])
			n = 1
		}
		if j := matMulGroup(prog, i); j > i+1 {
			c.execMatMuls(prog[i:j], n)
			i = j - 1
			continue
		}
		c.exec(op, tokens, n, pos0)
	}
	c.pos += len(tokens)
	return n
}

// matMulGroup returns the end of the run of matrix products starting at
// ops[i] that read the same input in the same activation format (Q, K and
// V; gate and up) and write other buffers: they share one quantization of
// the input and one split of their rows over the threads.
func matMulGroup(ops []Op, i int) int {
	first := &ops[i]
	if first.Kind != OpMatMul || first.Out == first.In {
		return i + 1
	}
	m0 := first.W.Mat
	j := i + 1
	for ; j < len(ops); j++ {
		op := &ops[j]
		if op.Kind != OpMatMul || op.In != first.In || op.Out == op.In || op.Output != first.Output {
			break
		}
		m := op.W.Mat
		if m.Cols != m0.Cols || m.Kernel.ActType != m0.Kernel.ActType {
			break
		}
	}
	return j
}

// execMatMuls runs a group from matMulGroup over n rows.
func (c *Context) execMatMuls(group []Op, n int) {
	in := group[0].In
	m0 := group[0].W.Mat
	xq := m0.QuantizeActs(c.pool, c.bufs[in][:n*m0.Cols], n, c.scratch)
	var mats [4]ops.Matrix
	var outs [4][]float32
	var lds [4]int
	for start := 0; start < len(group); start += len(mats) {
		g := group[start:min(len(group), start+len(mats))]
		for k := range g {
			mats[k] = g[k].W.Mat
			outs[k] = c.bufs[g[k].Out]
			lds[k] = c.m.Prog.Bufs[g[k].Out].Width
		}
		ops.MulQGroup(c.pool, mats[:len(g)], xq, n, outs[:len(g)], lds[:len(g)])
	}
	for k := range group {
		if op := &group[k]; op.Bias != nil {
			for t := 0; t < n; t++ {
				ops.AddTo(c.row(op.Out, t), op.Bias.Vector)
			}
		}
	}
}

func (c *Context) row(id BufID, t int) []float32 {
	w := c.m.Prog.Bufs[id].Width
	return c.bufs[id][t*w : (t+1)*w]
}

// exec runs one op over n rows on the CPU.
func (c *Context) exec(op *Op, tokens []int, n, pos0 int) {
	switch op.Kind {
	case OpEmbed:
		c.pool.Run(n, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				op.W.Mat.DequantizeRow(tokens[t], c.row(op.Out, t))
			}
		})
	case OpNorm:
		var w []float32
		if op.W != nil {
			w = op.W.Vector
		}
		c.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				ops.RMSNorm(c.row(op.Out, t), c.row(op.In, t), w, op.Eps)
			}
		})
	case OpHeadNorm:
		c.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				r := c.row(op.In, t)
				for hd := 0; hd < op.Heads; hd++ {
					v := r[hd*op.HeadSize : (hd+1)*op.HeadSize]
					ops.RMSNorm(v, v, op.W.Vector, op.Eps)
				}
			}
		})
	case OpMatMul:
		width := c.m.Prog.Bufs[op.Out].Width
		op.W.Mat.Mul(c.pool, c.bufs[op.In][:n*op.W.Mat.Cols], n, c.bufs[op.Out], width, c.scratch)
		if op.Bias != nil {
			for t := 0; t < n; t++ {
				ops.AddTo(c.row(op.Out, t), op.Bias.Vector)
			}
		}
	case OpRoPE:
		cos, sin := c.ropeTable(op.Rope, pos0, n)
		half := op.Rope.Dims / 2
		c.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				op.Rope.Apply(c.row(op.In, t), op.Heads, op.HeadSize, cos[t*half:(t+1)*half], sin[t*half:(t+1)*half])
			}
		})
	case OpAttention:
		kv := c.kv[op.Layer]
		for t := 0; t < n; t++ {
			kv.Store(pos0+t, c.row(op.In2, t), c.row(op.In3, t))
		}
		op.Attn.Run(c.pool, kv, c.bufs[op.In], c.bufs[op.Out], n, pos0)
	case OpSwiGLU:
		c.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				out := c.row(op.Out, t)
				if op.In2 < 0 {
					in := c.row(op.In, t)
					ops.SwiGLU(out, in[:len(out)], in[len(out):])
				} else {
					ops.SwiGLU(out, c.row(op.In, t), c.row(op.In2, t))
				}
			}
		})
	case OpAdd:
		for t := 0; t < n; t++ {
			ops.Add(c.row(op.Out, t), c.row(op.In, t), c.row(op.In2, t))
		}
	case OpMoE:
		c.moeFFN(op, n)
	default:
		panic(fmt.Sprintf("runtime: op %v has no CPU implementation", op.Kind))
	}
}

// ropeCache holds the rotation table of the current batch: every layer's
// Q and K rotations use the same positions, so cos and sin are computed
// once per batch instead of once per op (2·layers times).
type ropeCache struct {
	r        *ops.Rope
	pos0, n  int
	cos, sin []float32 // n rows of Dims/2
}

// ropeTable returns cos and sin for positions pos0..pos0+n-1 under r.
func (c *Context) ropeTable(r *ops.Rope, pos0, n int) (cos, sin []float32) {
	rc := &c.rope
	half := r.Dims / 2
	if rc.r != r || rc.pos0 != pos0 || rc.n != n {
		if cap(rc.cos) < n*half {
			rc.cos, rc.sin = make([]float32, n*half), make([]float32, n*half)
		}
		cs, sn := rc.cos[:n*half], rc.sin[:n*half]
		c.pool.Run(n, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				r.Table(pos0+t, cs[t*half:(t+1)*half], sn[t*half:(t+1)*half])
			}
		})
		rc.r, rc.pos0, rc.n = r, pos0, n
	}
	return rc.cos[:n*half], rc.sin[:n*half]
}

// moeScratch holds the buffers of the mixture-of-experts op.
type moeScratch struct {
	probs   []float32 // [n][nExpert] router output
	choice  []int     // [n][topK] chosen experts
	weight  []float32 // [n][topK] their weights
	in      []float32 // [cnt][nEmbd] gathered rows for one expert
	gate    []float32 // [cnt][nFF]
	up      []float32 // [cnt][nFF]
	down    []float32 // [cnt][nEmbd]
	results []float32 // [n][topK][nEmbd] weighted expert outputs
}

func (s *moeScratch) grow(batch int, op Op) {
	ne, k := op.W.Mat.Rows, op.TopK
	emb, ff := op.Gate.Stack[0].Cols, op.Gate.Stack[0].Rows
	fit := func(b []float32, n int) []float32 {
		if len(b) < n {
			return make([]float32, n)
		}
		return b
	}
	s.probs = fit(s.probs, batch*ne)
	s.weight = fit(s.weight, batch*k)
	if len(s.choice) < batch*k {
		s.choice = make([]int, batch*k)
	}
	s.in = fit(s.in, batch*emb)
	s.gate = fit(s.gate, batch*ff)
	s.up = fit(s.up, batch*ff)
	s.down = fit(s.down, batch*emb)
	s.results = fit(s.results, batch*k*emb)
}

// moeRoute routes one token: softmax over the router's logits p (in
// place), the k most probable experts into choice (ties: the lower id
// first) and their probabilities into weight, renormalised to sum to 1 when
// norm is set. idx is scratch of len(p).
func moeRoute(p []float32, k int, norm bool, choice []int, weight []float32, idx []int) {
	ops.Softmax(p)
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
	var sum float32
	for j := 0; j < k; j++ {
		choice[j] = idx[j]
		weight[j] = p[idx[j]]
		sum += p[idx[j]]
	}
	if norm {
		for j := 0; j < k; j++ {
			weight[j] /= sum
		}
	}
}

// moeFFN routes each token to its top experts and sums their outputs in
// slot order, as llama.cpp's build_moe_ffn does.
func (c *Context) moeFFN(op *Op, n int) {
	s := &c.moe
	ne, k := op.W.Mat.Rows, op.TopK
	emb := op.Gate.Stack[0].Cols
	ff := op.Gate.Stack[0].Rows
	op.W.Mat.Mul(c.pool, c.bufs[op.In][:n*emb], n, s.probs, ne, c.scratch)
	idx := make([]int, ne)
	for t := 0; t < n; t++ {
		moeRoute(s.probs[t*ne:(t+1)*ne], k, op.NormTopK, s.choice[t*k:(t+1)*k], s.weight[t*k:(t+1)*k], idx)
	}
	type slot struct{ t, j int }
	for e := 0; e < ne; e++ {
		var users []slot
		for t := 0; t < n; t++ {
			for j := 0; j < k; j++ {
				if s.choice[t*k+j] == e {
					users = append(users, slot{t, j})
				}
			}
		}
		if len(users) == 0 {
			continue
		}
		cnt := len(users)
		for i, u := range users {
			copy(s.in[i*emb:(i+1)*emb], c.row(op.In, u.t))
		}
		gate, up, down := op.Gate.Stack[e], op.Up.Stack[e], op.Down.Stack[e]
		xq := gate.QuantizeActs(c.pool, s.in[:cnt*emb], cnt, c.scratch)
		gate.MulQ(c.pool, xq, cnt, s.gate, ff)
		if up.Kernel.ActType == gate.Kernel.ActType {
			up.MulQ(c.pool, xq, cnt, s.up, ff)
		} else {
			up.Mul(c.pool, s.in[:cnt*emb], cnt, s.up, ff, c.scratch)
		}
		ops.SwiGLU(s.gate[:cnt*ff], s.gate[:cnt*ff], s.up[:cnt*ff])
		down.Mul(c.pool, s.gate[:cnt*ff], cnt, s.down, emb, c.scratch)
		for i, u := range users {
			dst := s.results[(u.t*k+u.j)*emb : (u.t*k+u.j+1)*emb]
			w := s.weight[u.t*k+u.j]
			for d := range dst {
				dst[d] = s.down[i*emb+d] * w
			}
		}
	}
	for t := 0; t < n; t++ {
		out := c.row(op.Out, t)
		copy(out, s.results[t*k*emb:(t*k+1)*emb])
		for j := 1; j < k; j++ {
			ops.AddTo(out, s.results[(t*k+j)*emb:(t*k+j+1)*emb])
		}
	}
}
