package cuda

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// mat is a weight matrix (or MoE expert stack) in device memory, in the
// format its WeightOps reads.
type mat struct {
	W          *ir.Weight
	Ptr        cudadrv.DevicePtr
	Rows, Cols int // of one expert for stacks
	Experts    int // 1 for a plain matrix
	// seq is a streamed weight's place in its schedule's order of
	// streamed weights (streamer); -1 for resident weights.
	seq int
	// skip is the bytes at the start of a streamed stack that are not
	// streamed: the experts of a split MoE layer that the host computes
	// (SegmentSpec.Split). Ptr is where the whole stack would begin, so
	// that expert e lies where the kernels look; the experts before skip
	// are never read there.
	skip int64
}

// WeightOps is the weight half of the GPU backend: everything that reads
// a weight matrix. The executor (exec.go, compile.go) only calls these; the kernels
// behind them decide the device format of the weights.
type WeightOps interface {
	Name() string
	// DeviceBytes is the device memory w takes in this format.
	DeviceBytes(w *ir.Weight) int64
	// Upload queues copying w to dst (DeviceBytes(w) bytes) on s. w.Data
	// must stay valid until s has passed the copy.
	Upload(s *cudadrv.Stream, w *ir.Weight, dst cudadrv.DevicePtr) (mat, error)
	// ScratchBytes is the scratch MatMul of m over nTok tokens needs
	// (quantized activations); MoEScratchBytes that of MoEMatMul.
	ScratchBytes(m *mat, nTok int) int
	MoEScratchBytes(m *mat, nTok, topK int, perSlot bool) int
	// MatMul: out[t*ldOut + r] = W[r]·x[t] for r < m.Rows, t < nTok.
	MatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr) error
	// GetRows: out[t] = row ids[t] of W as float, t < nTok (ids: int32).
	GetRows(s *cudadrv.Stream, m *mat, ids cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr) error
	// MoEMatMul: for token t and slot j < topK with e = ids[t*topK+j],
	// out[(t*topK+j)*m.Rows + r] = W_e[r]·x', x' = x[t], or x[t*topK+j]
	// when perSlot.
	MoEMatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr) error
}

// loadWeightOps loads the reference weight kernels and the quantized
// ones; quant is nil, and why says why, when those fail to load (the
// device still works, far slower, on the reference kernels).
func loadWeightOps(ctx *cudadrv.Context) (quant, ref WeightOps, why error, err error) {
	d, err := kernels.NewDense(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	ref = &refWeightOps{k: d, ctx: ctx}
	k, qerr := kernels.LoadWeightOps(ctx)
	if qerr != nil {
		return nil, ref, qerr, nil
	}
	return &quantOps{k: k, planes: q8PlanesFromEnv()}, ref, nil, nil
}

// EnvQ8Planes (ATS_GPU_Q8_PLANES=1) has the dense decode products read
// their activations in one Q8_1 plane, not two: a little faster, and
// further from the CPU's products (kernels.Q8_1PlanesBytes).
const EnvQ8Planes = "ATS_GPU_Q8_PLANES"

func q8PlanesFromEnv() int {
	if os.Getenv(EnvQ8Planes) == "1" {
		return 1
	}
	return 2
}

// refWeightOps is the reference weight path: every matrix is dequantized
// to float32 on the CPU by ops' dequantizers at upload, and the products
// are plain float32 kernels (kernels.Dense). Exact but four to eight times
// the memory of the file and far from fast: for tests and as the fallback.
type refWeightOps struct {
	k   *kernels.Dense
	ctx *cudadrv.Context
}

func (r *refWeightOps) Name() string { return "float32 reference" }

func (r *refWeightOps) DeviceBytes(w *ir.Weight) int64 {
	rows := 1
	for _, d := range w.Dims[1:] {
		rows *= d
	}
	return 4 * int64(rows) * int64(w.Dims[0])
}

func (r *refWeightOps) Upload(s *cudadrv.Stream, w *ir.Weight, dst cudadrv.DevicePtr) (mat, error) {
	k, err := ops.KernelFor(w.Type)
	if err != nil {
		return mat{}, fmt.Errorf("%s: %w", w.Name, err)
	}
	m, err := ops.NewMatrix(k, w.Rows(), w.Cols(), w.Data)
	if err != nil {
		return mat{}, fmt.Errorf("%s: %w", w.Name, err)
	}
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
		return mat{}, err
	}
	if err := r.ctx.CopyHtoD(dst, b); err != nil {
		return mat{}, err
	}
	return matOf(w, dst), nil
}

// SplitsMoE says whether weight path w can split an MoE layer's experts
// between the host and the GPU (SegmentSpec.Split): it streams a stack's
// experts in the file's layout, so a range of them is a range of bytes.
func SplitsMoE(w WeightOps) bool {
	_, ok := w.(*quantOps)
	return ok
}

// matOf describes w's shape for mat.
func matOf(w *ir.Weight, p cudadrv.DevicePtr) mat {
	g := mat{W: w, Ptr: p, Rows: w.Rows(), Cols: w.Cols(), Experts: 1, seq: -1}
	if ne := w.Experts(); ne > 0 {
		g.Experts = ne
		g.Rows = w.Rows() / ne
	}
	return g
}

func (r *refWeightOps) ScratchBytes(*mat, int) int { return 0 }

func (r *refWeightOps) MoEScratchBytes(*mat, int, int, bool) int { return 0 }

func (r *refWeightOps) MatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int, _ cudadrv.DevicePtr) error {
	return r.k.MatMul(s, out, m.Ptr, x, m.Rows*m.Experts, m.Cols, nTok, ldOut)
}

func (r *refWeightOps) GetRows(s *cudadrv.Stream, m *mat, ids cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr) error {
	return r.k.GetRows(s, out, m.Ptr, ids, m.Cols, nTok)
}

func (r *refWeightOps) MoEMatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, _ cudadrv.DevicePtr) error {
	return r.k.MoEMatMul(s, out, m.Ptr, x, perSlot, ids, m.Rows, m.Cols, nTok, topK)
}

// weightSet is the resident weights of a model in device memory for one
// placement (the set of matrices kept on the GPU; every vector and rope
// table always is, they are tiny), shared by the Execs that ask for the
// same set and freed when the last one closes.
type weightSet struct {
	key   weightSetKey
	refs  int
	arena cudadrv.DevicePtr
	bytes int64
	mats  map[*ir.Weight]*mat
	vecs  map[*ir.Weight]cudadrv.DevicePtr // 1-D float32 weights (norms, biases)
	ropes map[*ir.Rope]cudadrv.DevicePtr
}

// weightSets holds the uploaded weight sets.
var weightSets = struct {
	sync.Mutex
	m map[weightSetKey]*weightSet
}{m: map[weightSetKey]*weightSet{}}

type weightSetKey struct {
	prog     *ir.Program // the model's program
	w        WeightOps
	resident string // the resident matrices' names, joined
}

// programWeights lists each weight tensor of the program once, in
// execution order.
func programWeights(p *ir.Program) []*ir.Weight {
	seen := map[*ir.Weight]bool{}
	var ws []*ir.Weight
	for i := range p.Ops {
		for _, w := range p.Ops[i].Weights() {
			if !seen[w] {
				seen[w] = true
				ws = append(ws, w)
			}
		}
	}
	return ws
}

// align keeps every tensor on a 256-byte boundary, as cuMemAlloc would
// (the quantized kernels load 16 bytes at a time).
func align(n int64) int64 { return (n + 255) &^ 255 }

// isVector says whether w is a 1-D weight (a norm, a bias): always resident.
func isVector(w *ir.Weight) bool { return len(w.Dims) == 1 }

// setBytes is the device memory of the weight set: resident matrices in
// w's format, every vector and every rope factor table.
func setBytes(wo WeightOps, p *ir.Program, resident map[*ir.Weight]bool) int64 {
	var n int64
	for _, w := range programWeights(p) {
		switch {
		case isVector(w):
			n += align(int64(len(w.Data)))
		case resident[w]:
			n += align(wo.DeviceBytes(w))
		}
	}
	for _, r := range ropeTables(p) {
		n += align(int64(4 * len(r.Factors)))
	}
	return n
}

func ropeTables(p *ir.Program) []*ir.Rope {
	var rs []*ir.Rope
	seen := map[*ir.Rope]bool{}
	for i := range p.Ops {
		if r := p.Ops[i].Rope; r != nil && r.Factors != nil && !seen[r] {
			seen[r] = true
			rs = append(rs, r)
		}
	}
	return rs
}

// residentKey names a resident set: the resident matrices, in order.
func residentKey(p *ir.Program, resident map[*ir.Weight]bool) string {
	var b strings.Builder
	for _, w := range programWeights(p) {
		if !isVector(w) && resident[w] {
			b.WriteString(w.Name)
			b.WriteByte(0)
		}
	}
	return b.String()
}

// acquireWeights returns the weight set of (p, w, resident), uploading it
// on the first call. Pair each call with releaseWeights.
func acquireWeights(dev *Device, wo WeightOps, p *ir.Program, resident map[*ir.Weight]bool, files [][]byte, opt backend.Options) (*weightSet, error) {
	key := weightSetKey{p, wo, residentKey(p, resident)}
	weightSets.Lock()
	defer weightSets.Unlock()
	if g := weightSets.m[key]; g != nil {
		g.refs++
		return g, nil
	}
	g, err := uploadWeights(dev, wo, p, resident, files, opt)
	if err != nil {
		return nil, err
	}
	g.key, g.refs = key, 1
	weightSets.m[key] = g
	return g, nil
}

func releaseWeights(dev *Device, g *weightSet) error {
	weightSets.Lock()
	defer weightSets.Unlock()
	if g.refs--; g.refs > 0 {
		return nil
	}
	delete(weightSets.m, g.key)
	return dev.ctx.Free(g.arena)
}

// uploadWeights copies the resident set into one device arena. The
// file's mapping is registered (page-locked, read-only) for the duration
// unless the caller holds a registration already, so the copies run at
// the link's speed from the mapped pages without a staging copy; where
// registration fails they still work, at pageable-copy speed.
func uploadWeights(dev *Device, wo WeightOps, p *ir.Program, resident map[*ir.Weight]bool, files [][]byte, opt backend.Options) (*weightSet, error) {
	g := &weightSet{mats: map[*ir.Weight]*mat{}, vecs: map[*ir.Weight]cudadrv.DevicePtr{}, ropes: map[*ir.Rope]cudadrv.DevicePtr{}}
	g.bytes = setBytes(wo, p, resident)
	var err error
	if g.arena, err = dev.ctx.Alloc(int(max(g.bytes, 256))); err != nil {
		return nil, fmt.Errorf("gpu: resident weights (%.2f GiB): %w", float64(g.bytes)/(1<<30), err)
	}
	fail := func(err error) (*weightSet, error) {
		_ = dev.ctx.Free(g.arena)
		return nil, fmt.Errorf("gpu: uploading the weights: %w", err)
	}
	s, err := dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return fail(err)
	}
	defer s.Destroy()
	reg, _ := registerFiles(dev, files, false, opt)
	defer reg.release()
	off := int64(0)
	for _, w := range programWeights(p) {
		dst := g.arena.Add(int(off))
		if isVector(w) {
			if w.Type != gguf.TypeF32 {
				return fail(fmt.Errorf("%s: 1-D weight of type %s", w.Name, w.Type))
			}
			if err := s.CopyHtoD(dst, w.Data); err != nil {
				return fail(fmt.Errorf("%s: %w", w.Name, err))
			}
			g.vecs[w] = dst
			off += align(int64(len(w.Data)))
			continue
		}
		if !resident[w] {
			continue
		}
		gm, err := wo.Upload(s, w, dst)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", w.Name, err))
		}
		g.mats[w] = &gm
		off += align(wo.DeviceBytes(w))
	}
	for _, r := range ropeTables(p) {
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
		off += align(int64(len(b)))
	}
	if err := s.Synchronize(); err != nil {
		return fail(err)
	}
	if off != g.bytes {
		return fail(errors.New("weight sizes changed during the upload"))
	}
	return g, nil
}

// registration is the model file's mapping page-locked for the device, so
// weight copies from it run on the copy engine at the link's speed.
// Registrations are shared: a part registered by one holder is reused by
// the next and unregistered when the last lets go (the driver refuses to
// register the same pages twice). Where the driver refuses to register a
// part and the holder asks for it (a context that streams weights), the
// part is copied once into pinned memory instead, and copies read that.
type registration struct {
	parts []*registeredPart
	// Pinned says whether every part is page-locked, registered or
	// copied; when false, copies from the file go through the driver's
	// pageable path (about a third of the link's speed).
	Pinned bool
	// Copied is the bytes of the parts held as pinned copies (the
	// driver refused to register them, for Why).
	Copied int64
	Why    string // why a part is not registered
}

type registeredPart struct {
	reg  *cudadrv.Registration
	data []byte           // the part itself
	copy *cudadrv.HostMem // or its pinned copy
	refs int
}

var registered = struct {
	sync.Mutex
	m map[*byte]*registeredPart
}{m: map[*byte]*registeredPart{}}

// registerFiles registers each part of the mapped file, read-only where
// the device allows; a part the driver refuses is copied into pinned
// memory when copies is set. It never fails: what could not be
// registered is said in Why, and copies still work from pageable memory.
// Options.NoRegister never registers the file (copies then read pinned
// copies of what streams, or pageable memory for the upload): for systems
// whose driver misbehaves with registered file mappings, and for testing
// that path.
func registerFiles(dev *Device, files [][]byte, copies bool, opt backend.Options) (*registration, error) {
	r := &registration{Pinned: len(files) > 0}
	if len(files) == 0 {
		r.Why = "nothing of the file to register"
	}
	can := true
	switch {
	case !dev.info.HostRegisterSupported:
		can, r.Why = false, "the device does not support registering host memory"
	case opt.NoRegister:
		can, r.Why = false, "registering was turned off (ATS_GPU_REGISTER=0)"
	}
	if !can && !copies {
		r.Pinned = false
		return r, nil
	}
	flags := cudadrv.HostRegisterPortable
	if dev.info.ReadOnlyHostRegisterSupport {
		flags |= cudadrv.HostRegisterReadOnly
	}
	registered.Lock()
	defer registered.Unlock()
	for _, part := range files {
		if len(part) == 0 {
			continue
		}
		key := &part[0]
		p := registered.m[key]
		if p != nil && len(p.data) != len(part) {
			p = nil // another holder's stretch from the same page: not this one
		}
		if p == nil {
			p = &registeredPart{data: part}
			var err error
			if can {
				p.reg, err = dev.ctx.HostRegister(part, flags)
				if err != nil {
					r.Why = err.Error()
				}
			}
			if p.reg == nil {
				if !copies {
					r.Pinned = false
					continue
				}
				if p.copy, err = pinnedCopy(dev, part); err != nil {
					r.Pinned, r.Why = false, r.Why+"; no pinned copy either: "+err.Error()
					continue
				}
			}
			if registered.m[key] == nil {
				registered.m[key] = p
			}
		}
		if p.copy != nil {
			r.Copied += int64(len(part))
		}
		p.refs++
		r.parts = append(r.parts, p)
	}
	return r, nil
}

// pinnedCopy copies b into new pinned host memory, several goroutines at
// once (a single core copies a few GB/s; a model's host weights are
// gigabytes).
func pinnedCopy(dev *Device, b []byte) (*cudadrv.HostMem, error) {
	h, err := dev.ctx.HostAlloc(len(b), cudadrv.HostAllocPortable)
	if err != nil {
		return nil, err
	}
	dst := h.Bytes()
	const chunk = 64 << 20
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, goruntime.GOMAXPROCS(0)))
	for off := 0; off < len(b); off += chunk {
		end := min(off+chunk, len(b))
		sem <- struct{}{}
		wg.Go(func() {
			copy(dst[off:end], b[off:end])
			<-sem
		})
	}
	wg.Wait()
	return h, nil
}

// source is where copies of b (a weight's bytes in the file) read from: its
// pinned copy, or b itself.
func (r *registration) source(b []byte) []byte {
	if r == nil || r.Copied == 0 || len(b) == 0 {
		return b
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	for _, p := range r.parts {
		if p.copy == nil {
			continue
		}
		base := uintptr(unsafe.Pointer(&p.data[0]))
		if lo >= base && lo+uintptr(len(b)) <= base+uintptr(len(p.data)) {
			off := int(lo - base)
			return p.copy.Bytes()[off : off+len(b)]
		}
	}
	return b
}

func (r *registration) release() {
	if r == nil {
		return
	}
	registered.Lock()
	defer registered.Unlock()
	for _, p := range r.parts {
		if p.refs--; p.refs == 0 {
			if p.reg != nil {
				_ = p.reg.Unregister()
			}
			if p.copy != nil {
				_ = p.copy.Free()
			}
			for k, v := range registered.m {
				if v == p {
					delete(registered.m, k)
				}
			}
		}
	}
	r.parts = nil
}

// actFormat is a format of activations as the weight kernels read them.
type actFormat uint8

const (
	actF32    actFormat = iota // float32 rows as the executor keeps them
	actQ8_1                    // kernels.Q8_1Bytes layout (integer matrix-vector products)
	actF16                     // kernels.F16Bytes layout (tensor-core products)
	actMixed                   // members of a group disagree: no shared input
	actQ8_1x2                  // actQ8_1 in two planes (kernels.Q8_1PlanesBytes)
)

// q8Planes is how many Q8_1 planes f holds: 2 for actQ8_1x2, 1 for
// actQ8_1, 0 for the other formats.
func (f actFormat) q8Planes() int {
	switch f {
	case actQ8_1:
		return 1
	case actQ8_1x2:
		return 2
	}
	return 0
}

// preparedOps is implemented by weight kernels that read activations in
// another format than float32. The executor then converts an input once
// for all the products that share it (Q, K and V; gate and up), and its
// own kernels write the Q8_1 form directly where they produce a product's
// input (a norm, SwiGLU): no conversion launch at all.
type preparedOps interface {
	// InputFormat is the format MatMul of m over nTok tokens reads, in
	// a decode step (one token of each sequence) or not.
	InputFormat(m *mat, nTok int, decode bool) actFormat
	// InputBytes is the size of nTok rows of cols activations in f.
	InputBytes(f actFormat, nTok, cols int) int
	// Prepare converts x (nTok rows of cols floats) into f at dst.
	Prepare(s *cudadrv.Stream, f actFormat, x cudadrv.DevicePtr, nTok, cols int, dst cudadrv.DevicePtr) error
	// MatMulPrepared is MatMul from activations in f at x (actF32: the
	// float rows themselves).
	MatMulPrepared(s *cudadrv.Stream, m *mat, f actFormat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error
}

// moePreparedOps is implemented by weight kernels whose expert products
// can read prepared (Q8_1) activations: the executor then quantizes the
// input of gate and up once (or has the norm before write it) and has
// SwiGLU write the input of down.
type moePreparedOps interface {
	// MoEInputFormat is the format MoEMatMulPrepared of m reads at nTok
	// tokens: actQ8_1, or actMixed where it has no such path.
	MoEInputFormat(m *mat, nTok int) actFormat
	MoEMatMulPrepared(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr) error
}

// streamedParts is what of the mapped file a context keeps registered:
// the stretches that hold the matrices that may stream (whole pages,
// neighbours merged), not the whole file. The GPU-resident matrices'
// pages are then free to leave host memory once uploaded, and only the
// host-resident weights stay page-locked.
func streamedParts(files [][]byte, p *ir.Program, streams, resident map[*ir.Weight]bool) [][]byte {
	if len(streams) == 0 {
		return nil
	}
	page := uintptr(os.Getpagesize())
	type span struct{ lo, hi uintptr }
	var out [][]byte
	for _, f := range files {
		if len(f) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(&f[0]))
		end := base + uintptr(len(f))
		var spans []span
		for _, w := range programWeights(p) {
			if isVector(w) || len(w.Data) == 0 || !streams[w] || resident[w] {
				continue
			}
			lo := uintptr(unsafe.Pointer(&w.Data[0]))
			if lo < base || lo >= end {
				continue
			}
			hi := min(lo+uintptr(len(w.Data)), end)
			spans = append(spans, span{max(lo&^(page-1), base), min((hi+page-1)&^(page-1), end)})
		}
		slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
		for i := 0; i < len(spans); {
			s := spans[i]
			for i++; i < len(spans) && spans[i].lo <= s.hi; i++ {
				s.hi = max(s.hi, spans[i].hi)
			}
			out = append(out, f[s.lo-base:s.hi-base])
		}
	}
	return out
}
