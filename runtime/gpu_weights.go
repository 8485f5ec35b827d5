package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
)

// gpuMat is a weight matrix (or MoE expert stack) in device memory, in the
// format its gpuWeightOps reads.
type gpuMat struct {
	W          *Weight
	Ptr        cudadrv.DevicePtr
	Rows, Cols int // of one expert for stacks
	Experts    int // 1 for a plain matrix
}

// gpuWeightOps is the weight half of the GPU backend: everything that reads
// a weight matrix. The executor (gpu_exec.go) only calls these; the kernels
// behind them decide the device format of the weights.
type gpuWeightOps interface {
	Name() string
	// DeviceBytes is the device memory w takes in this format.
	DeviceBytes(w *Weight) int64
	// Upload queues copying w to dst (DeviceBytes(w) bytes) on s. w.Data
	// must stay valid until s has passed the copy.
	Upload(s *cudadrv.Stream, w *Weight, dst cudadrv.DevicePtr) (gpuMat, error)
	// ScratchBytes is the scratch MatMul of m over nTok tokens needs
	// (quantized activations); MoEScratchBytes that of MoEMatMul.
	ScratchBytes(m *gpuMat, nTok int) int
	MoEScratchBytes(m *gpuMat, nTok, topK int, perSlot bool) int
	// MatMul: out[t*ldOut + r] = W[r]·x[t] for r < m.Rows, t < nTok.
	MatMul(s *cudadrv.Stream, m *gpuMat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr) error
	// GetRows: out[t] = row ids[t] of W as float, t < nTok (ids: int32).
	GetRows(s *cudadrv.Stream, m *gpuMat, ids cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr) error
	// MoEMatMul: for token t and slot j < topK with e = ids[t*topK+j],
	// out[(t*topK+j)*m.Rows + r] = W_e[r]·x', x' = x[t], or x[t*topK+j]
	// when perSlot.
	MoEMatMul(s *cudadrv.Stream, m *gpuMat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr) error
}

// EnvGPUWeights selects the weight kernels: "ref" forces the float32
// reference path (refWeightOps); anything else takes the quantized kernels
// when this build has them.
const EnvGPUWeights = "ATS_GPU_WEIGHTS"

// loadWeightOps loads the reference weight kernels and picks the ones the
// device's contexts use: the quantized kernels unless EnvGPUWeights says
// "ref" or this build has none.
func loadWeightOps(ctx *cudadrv.Context, info cudadrv.DeviceInfo) (use, ref gpuWeightOps, err error) {
	d, err := kernels.NewDense(ctx)
	if err != nil {
		return nil, nil, err
	}
	ref = &refWeightOps{k: d, ctx: ctx}
	if os.Getenv(EnvGPUWeights) == "ref" || quantWeightOps == nil {
		return ref, ref, nil
	}
	if use, err = quantWeightOps(ctx, info); err != nil {
		// Still usable, far slower: say so rather than refuse the GPU.
		fmt.Fprintf(os.Stderr, "ats: the GPU weight kernels failed to load (%v); using the float32 reference kernels\n", err)
		return ref, ref, nil
	}
	return use, ref, nil
}

// quantWeightOps, when set (gpu_weightops.go), loads the quantized weight
// kernels that read the GGUF blocks as they are.
var quantWeightOps func(ctx *cudadrv.Context, info cudadrv.DeviceInfo) (gpuWeightOps, error)

// refWeightOps is the reference weight path: every matrix is dequantized
// to float32 on the CPU by ops' dequantizers at upload, and the products
// are plain float32 kernels (kernels.Dense). Exact but four to eight times
// the memory of the file and far from fast: for tests and as the fallback.
type refWeightOps struct {
	k   *kernels.Dense
	ctx *cudadrv.Context
}

func (r *refWeightOps) Name() string { return "float32 reference" }

func (r *refWeightOps) DeviceBytes(w *Weight) int64 {
	rows := 1
	for _, d := range w.Dims[1:] {
		rows *= d
	}
	return 4 * int64(rows) * int64(w.Dims[0])
}

func (r *refWeightOps) Upload(s *cudadrv.Stream, w *Weight, dst cudadrv.DevicePtr) (gpuMat, error) {
	m := w.Mat
	f := make([]float32, m.Rows*m.Cols)
	for i := 0; i < m.Rows; i++ {
		m.DequantizeRow(i, f[i*m.Cols:(i+1)*m.Cols])
	}
	b := make([]byte, 4*len(f))
	for i, v := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	// From Go memory: a synchronous copy, so b may go right after.
	if err := s.Synchronize(); err != nil {
		return gpuMat{}, err
	}
	if err := r.ctx.CopyHtoD(dst, b); err != nil {
		return gpuMat{}, err
	}
	return matOf(w, dst), nil
}

// matOf describes w's shape for gpuMat.
func matOf(w *Weight, p cudadrv.DevicePtr) gpuMat {
	g := gpuMat{W: w, Ptr: p, Rows: w.Mat.Rows, Cols: w.Mat.Cols, Experts: 1}
	if len(w.Stack) > 0 {
		g.Experts = len(w.Stack)
		g.Rows = w.Stack[0].Rows
	}
	return g
}

func (r *refWeightOps) ScratchBytes(*gpuMat, int) int { return 0 }

func (r *refWeightOps) MoEScratchBytes(*gpuMat, int, int, bool) int { return 0 }

func (r *refWeightOps) MatMul(s *cudadrv.Stream, m *gpuMat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int, _ cudadrv.DevicePtr) error {
	return r.k.MatMul(s, out, m.Ptr, x, m.Rows*m.Experts, m.Cols, nTok, ldOut)
}

func (r *refWeightOps) GetRows(s *cudadrv.Stream, m *gpuMat, ids cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr) error {
	return r.k.GetRows(s, out, m.Ptr, ids, m.Cols, nTok)
}

func (r *refWeightOps) MoEMatMul(s *cudadrv.Stream, m *gpuMat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, _ cudadrv.DevicePtr) error {
	return r.k.MoEMatMul(s, out, m.Ptr, x, perSlot, ids, m.Rows, m.Cols, nTok, topK)
}

// gpuModel is a model's weights in device memory, shared by the model's GPU
// contexts and freed when the last one closes.
type gpuModel struct {
	refs  int
	arena cudadrv.DevicePtr
	bytes int64
	mats  map[*Weight]*gpuMat
	vecs  map[*Weight]cudadrv.DevicePtr // 1-D float32 weights (norms, biases)
	ropes map[*ops.Rope]cudadrv.DevicePtr
}

// gpuModels holds the uploaded weights by model and weight format.
var gpuModels = struct {
	sync.Mutex
	m map[gpuModelKey]*gpuModel
}{m: map[gpuModelKey]*gpuModel{}}

type gpuModelKey struct {
	m *Model
	w gpuWeightOps
}

// programWeights lists each weight tensor of the program once, in
// execution order.
func programWeights(p *Program) []*Weight {
	seen := map[*Weight]bool{}
	var ws []*Weight
	for i := range p.Ops {
		op := &p.Ops[i]
		for _, w := range []*Weight{op.W, op.Bias, op.Gate, op.Up, op.Down} {
			if w != nil && !seen[w] {
				seen[w] = true
				ws = append(ws, w)
			}
		}
	}
	return ws
}

// gpuAlign keeps every tensor on a 256-byte boundary, as cuMemAlloc would
// (the quantized kernels load 16 bytes at a time).
func gpuAlign(n int64) int64 { return (n + 255) &^ 255 }

// weightBytes is the device memory the program's weights take in w's format.
func weightBytes(wo gpuWeightOps, p *Program) int64 {
	var n int64
	for _, w := range programWeights(p) {
		if len(w.Dims) == 1 {
			n += gpuAlign(int64(len(w.Data)))
		} else {
			n += gpuAlign(wo.DeviceBytes(w))
		}
	}
	for i := range p.Ops {
		if r := p.Ops[i].Rope; r != nil && r.Factors != nil {
			n += gpuAlign(int64(4 * len(r.Factors)))
		}
	}
	return n
}

// acquireGPUModel returns m's weights on the device in w's format,
// uploading them on the first call. Pair each call with releaseGPUModel.
func acquireGPUModel(dev *gpuDevice, w gpuWeightOps, m *Model) (*gpuModel, error) {
	gpuModels.Lock()
	defer gpuModels.Unlock()
	key := gpuModelKey{m, w}
	if g := gpuModels.m[key]; g != nil {
		g.refs++
		return g, nil
	}
	g, err := uploadModel(dev, w, m)
	if err != nil {
		return nil, err
	}
	g.refs = 1
	gpuModels.m[key] = g
	return g, nil
}

func releaseGPUModel(dev *gpuDevice, w gpuWeightOps, m *Model) error {
	gpuModels.Lock()
	defer gpuModels.Unlock()
	key := gpuModelKey{m, w}
	g := gpuModels.m[key]
	if g == nil {
		return nil
	}
	if g.refs--; g.refs > 0 {
		return nil
	}
	delete(gpuModels.m, key)
	return dev.ctx.Free(g.arena)
}

// uploadModel copies every weight of m's program into one device arena.
// The file's mapping is registered (page-locked, read-only) for the
// duration, so the copies run at the link's speed from the mapped pages
// without a staging copy; where registration fails they still work, at
// pageable-copy speed.
func uploadModel(dev *gpuDevice, wo gpuWeightOps, m *Model) (*gpuModel, error) {
	p := m.Prog
	g := &gpuModel{mats: map[*Weight]*gpuMat{}, vecs: map[*Weight]cudadrv.DevicePtr{}, ropes: map[*ops.Rope]cudadrv.DevicePtr{}}
	g.bytes = weightBytes(wo, p)
	var err error
	if g.arena, err = dev.ctx.Alloc(int(max(g.bytes, 256))); err != nil {
		return nil, fmt.Errorf("gpu: weights of %s (%.2f GiB): %w", m.File.Path, float64(g.bytes)/(1<<30), err)
	}
	fail := func(err error) (*gpuModel, error) {
		_ = dev.ctx.Free(g.arena)
		return nil, fmt.Errorf("gpu: uploading the weights of %s: %w", m.File.Path, err)
	}
	s, err := dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return fail(err)
	}
	defer s.Destroy()
	if dev.info.HostRegisterSupported {
		flags := cudadrv.HostRegisterPortable
		if dev.info.ReadOnlyHostRegisterSupport {
			flags |= cudadrv.HostRegisterReadOnly
		}
		for _, part := range m.File.Parts {
			if r, err := dev.ctx.HostRegister(part.Data, flags); err == nil {
				defer r.Unregister()
			}
		}
	}
	off := int64(0)
	for _, w := range programWeights(p) {
		dst := g.arena.Add(int(off))
		if len(w.Dims) == 1 {
			if w.Type != gguf.TypeF32 {
				return fail(fmt.Errorf("%s: 1-D weight of type %s", w.Name, w.Type))
			}
			if err := s.CopyHtoD(dst, w.Data); err != nil {
				return fail(fmt.Errorf("%s: %w", w.Name, err))
			}
			g.vecs[w] = dst
			off += gpuAlign(int64(len(w.Data)))
			continue
		}
		gm, err := wo.Upload(s, w, dst)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", w.Name, err))
		}
		g.mats[w] = &gm
		off += gpuAlign(wo.DeviceBytes(w))
	}
	for i := range p.Ops {
		r := p.Ops[i].Rope
		if r == nil || r.Factors == nil || g.ropes[r] != 0 {
			continue
		}
		dst := g.arena.Add(int(off))
		b := make([]byte, 4*len(r.Factors))
		for j, v := range r.Factors {
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(v))
		}
		if err := s.Synchronize(); err != nil {
			return fail(err)
		}
		if err := dev.ctx.CopyHtoD(dst, b); err != nil {
			return fail(err)
		}
		g.ropes[r] = dst
		off += gpuAlign(int64(len(b)))
	}
	if err := s.Synchronize(); err != nil {
		return fail(err)
	}
	if off != g.bytes {
		return fail(errors.New("weight sizes changed during the upload"))
	}
	return g, nil
}

// actFormat is a format of activations as the weight kernels read them.
type actFormat uint8

const (
	actF32   actFormat = iota // float32 rows as the executor keeps them
	actQ8_1                   // kernels.Q8_1Bytes layout (integer matrix-vector products)
	actF16                    // kernels.F16Bytes layout (tensor-core products)
	actMixed                  // members of a group disagree: no shared input
)

// gpuPreparedOps is implemented by weight kernels that read activations in
// another format than float32. The executor then converts an input once
// for all the products that share it (Q, K and V; gate and up), and its
// own kernels write the Q8_1 form directly where they produce a product's
// input (a norm, SwiGLU): no conversion launch at all.
type gpuPreparedOps interface {
	// InputFormat is the format MatMul of m over nTok tokens reads.
	InputFormat(m *gpuMat, nTok int) actFormat
	// InputBytes is the size of nTok rows of cols activations in f.
	InputBytes(f actFormat, nTok, cols int) int
	// Prepare converts x (nTok rows of cols floats) into f at dst.
	Prepare(s *cudadrv.Stream, f actFormat, x cudadrv.DevicePtr, nTok, cols int, dst cudadrv.DevicePtr) error
	// MatMulPrepared is MatMul from activations in f at x (actF32: the
	// float rows themselves).
	MatMulPrepared(s *cudadrv.Stream, m *gpuMat, f actFormat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error
}

// gpuMoEPreparedOps is implemented by weight kernels whose expert products
// can read prepared (Q8_1) activations: the executor then quantizes the
// input of gate and up once (or has the norm before write it) and has
// SwiGLU write the input of down.
type gpuMoEPreparedOps interface {
	// MoEInputFormat is the format MoEMatMulPrepared of m reads at nTok
	// tokens: actQ8_1, or actMixed where it has no such path.
	MoEInputFormat(m *gpuMat, nTok int) actFormat
	MoEMatMulPrepared(s *cudadrv.Stream, m *gpuMat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr) error
}
