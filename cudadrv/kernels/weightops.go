package kernels

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/gguf"
)

// Weight products on the GPU: the kernels of matvec.cu (activation
// quantization, integer and float matrix-vector products for decode) and
// matmul.cu (tensor-core matrix products for prefill, embedding rows, MoE
// grouping), with launchers that pick the kernel by token count.
//
// Every launcher only queues work on its stream: no host synchronisation,
// no allocation, no host-side reads of device data (expert ids and token
// ids stay on the device), so a sequence of them can be captured into a
// CUDA graph. Scratch buffers are the caller's: the *Bytes functions give
// their sizes.

// Matrix is a weight matrix on the device, in its GGUF block layout: Rows
// rows of Cols values (Cols along the dot product, a multiple of the type's
// block size), rows back to back. Data must be 16-byte aligned (GGUF
// tensors are 32-byte aligned; cuMemAlloc gives 256). For an MoE expert
// stack, Data is the first expert and the others follow every Bytes().
type Matrix struct {
	Type       gguf.Type
	Data       cudadrv.DevicePtr
	Rows, Cols int
}

// RowBytes is the size of one row.
func (m Matrix) RowBytes() int {
	info, _ := m.Type.Info()
	if info.BlockSize == 0 {
		return 0
	}
	return m.Cols / info.BlockSize * info.BlockBytes
}

// Bytes is the size of the matrix (of one expert of a stack).
func (m Matrix) Bytes() int { return m.Rows * m.RowBytes() }

// MatVecMaxTokens is the most tokens one launch of the matrix-vector
// kernels takes.
const MatVecMaxTokens = 8

// MatVecQ8_1MaxTokens is the most tokens MatVecQ8_1 takes: on the integer
// tensor cores (mvt_) or in matvec launches of up to MatVecMaxTokens
// tokens, each reading the weights once. The engine's prepared path
// (runtime/backend/cuda) uses it for decode rows up to there, the f16
// tensor-core kernels (mm_) above, whose cost hardly shrinks below a
// prompt batch's: a 14B decode step of 9 rows cost 43 ms on an H200 on
// them, against 5 ms for one row.
const MatVecQ8_1MaxTokens = 48

// WeightTypes are the weight types the kernels support, in type-id order:
// those of the CPU path (ops.SupportedTypes).
var WeightTypes = []gguf.Type{
	gguf.TypeF32, gguf.TypeF16, gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0,
	gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeBF16,
}

// kernelName is the type's suffix in kernel names.
func kernelName(t gguf.Type) string {
	switch t {
	case gguf.TypeF32:
		return "f32"
	case gguf.TypeF16:
		return "f16"
	case gguf.TypeBF16:
		return "bf16"
	case gguf.TypeQ4_0:
		return "q4_0"
	case gguf.TypeQ4_1:
		return "q4_1"
	case gguf.TypeQ5_0:
		return "q5_0"
	case gguf.TypeQ5_1:
		return "q5_1"
	case gguf.TypeQ8_0:
		return "q8_0"
	case gguf.TypeQ2_K:
		return "q2_k"
	case gguf.TypeQ3_K:
		return "q3_k"
	case gguf.TypeQ4_K:
		return "q4_k"
	case gguf.TypeQ5_K:
		return "q5_k"
	case gguf.TypeQ6_K:
		return "q6_k"
	}
	return ""
}

// isFloat reports whether t is a float type (its matvec reads f32
// activations instead of Q8_1).
func isFloat(t gguf.Type) bool {
	return t == gguf.TypeF32 || t == gguf.TypeF16 || t == gguf.TypeBF16
}

// typeKernels are the kernels of one weight type.
type typeKernels struct {
	mv      [4]*cudadrv.Function // NTOK 1, 2, 4, 8
	mvp     [4]*cudadrv.Function // NTOK 1, 2, 4, 8 in two planes (integer types)
	mvR1    *cudadrv.Function    // NTOK 1 with 1 / 4 rows per row group (benchmarks)
	mvR4    *cudadrv.Function
	mvt     [2][len(mvtTokens)]*cudadrv.Function // tensor-core decode rows (Q4_K, Q6_K): mvt_, mvt2_ by mvtTokens
	mvtMin  int                                  // fewest tokens that take mvt_ by default (0: none)
	mm      [3]*cudadrv.Function                 // by token tile: mm_ (128), mm64_, mm32_; see mmTiles
	getRows *cudadrv.Function
}

// WeightOps holds the weight kernels of one context. Each of its two
// modules loads at the first launch that needs it: matvec.cu at the first
// matrix-vector product (decode, small batches), matmul.cu at the first
// tensor-core product (prefill), embedding rows or MoE grouping.
type WeightOps struct {
	matvec, matmul lazyModule

	quantizeQ8_1, convertF16, moeGroup *cudadrv.Function
	types                              [int(gguf.TypeBF16) + 1]*typeKernels
	sms                                int          // multiprocessors, for the matvec split
	tensorCoreInt8                     bool         // CC 8.0 or later: the mvt_ kernels run
	mvtMin                             atomic.Int32 // SetDecodeMMA: -1 the types' own minimum, 0 off, else the fewest tokens
	batchPlanes                        atomic.Bool  // SetBatchPlanes: products of several rows read both planes

	// Benchmark knobs (package tests only): rows per row group of the
	// one-token matvec (0: the default 2; 1 or 4 where built), a forced
	// K split (0: automatic), and the token tile of the dense and the MoE
	// tensor-core products (0: automatic; else one of mmTiles).
	mvRows, mvKS int
	mmBN, moeBN  int
}

// NewWeightOps prepares matvec.cu's and matmul.cu's kernels for the
// context's device; the modules load when first needed.
func NewWeightOps(ctx *cudadrv.Context) (*WeightOps, error) {
	sms, err := ctx.Device().Attribute(cudadrv.AttrMultiprocessorCount)
	if err != nil {
		return nil, err
	}
	major, _, err := ctx.Device().ComputeCapability()
	if err != nil {
		return nil, err
	}
	w := &WeightOps{sms: max(1, sms), tensorCoreInt8: major >= 8}
	w.mvtMin.Store(-1)
	mv := map[string]**cudadrv.Function{"quantize_q8_1": &w.quantizeQ8_1}
	mm := map[string]**cudadrv.Function{"convert_f16": &w.convertF16, "moe_group": &w.moeGroup}
	for _, t := range WeightTypes {
		k := new(typeKernels)
		w.types[t] = k
		n := kernelName(t)
		prefix := "mv_"
		if isFloat(t) {
			prefix = "mvf_"
		}
		for i, nt := range []int{1, 2, 4, 8} {
			mv[fmt.Sprintf("%s%s_%d", prefix, n, nt)] = &k.mv[i]
		}
		if !isFloat(t) {
			for i, nt := range []int{1, 2, 4, 8} {
				mv[fmt.Sprintf("mv_%s_%dp", n, nt)] = &k.mvp[i]
			}
		}
		if fewest, ok := mvtTypes[t]; ok {
			k.mvtMin = fewest
			for i, nt := range mvtTokens {
				mv[fmt.Sprintf("mvt_%s_%d", n, nt)] = &k.mvt[0][i]
				mv[fmt.Sprintf("mvt2_%s_%d", n, nt)] = &k.mvt[1][i]
			}
		}
		if t == gguf.TypeQ4_K || t == gguf.TypeQ6_K || t == gguf.TypeQ8_0 {
			mv["mv_"+n+"_1_r1"] = &k.mvR1
			mv["mv_"+n+"_1_r4"] = &k.mvR4
		}
		for i, bn := range mmTiles {
			mm[mmKernelName(bn, n)] = &k.mm[i]
		}
		mm["get_rows_"+n] = &k.getRows
	}
	if err := w.matvec.prepareLookup(ctx, "matvec", mv); err != nil {
		return nil, err
	}
	if err := w.matmul.prepareLookup(ctx, "matmul", mm); err != nil {
		return nil, err
	}
	return w, nil
}

// LoadWeightOps is NewWeightOps with both modules loaded now.
func LoadWeightOps(ctx *cudadrv.Context) (*WeightOps, error) { return loadNow(NewWeightOps(ctx)) }

// Load loads both modules now if they are not yet.
func (w *WeightOps) Load() error {
	if err := w.matvec.ready(); err != nil {
		return err
	}
	return w.matmul.ready()
}

// Loaded reports which of the two modules are loaded.
func (w *WeightOps) Loaded() (matvec, matmul bool) { return w.matvec.Loaded(), w.matmul.Loaded() }

// Unload unloads both modules.
func (w *WeightOps) Unload() error {
	err1 := w.matvec.Unload()
	err2 := w.matmul.Unload()
	if err1 != nil {
		return err1
	}
	return err2
}

func (w *WeightOps) kernels(m Matrix) (*typeKernels, error) {
	var k *typeKernels
	if int(m.Type) < len(w.types) {
		k = w.types[m.Type]
	}
	if k == nil {
		return nil, fmt.Errorf("kernels: no GPU weight kernels for type %s", m.Type)
	}
	info, _ := m.Type.Info()
	switch {
	case m.Rows <= 0 || m.Cols <= 0:
		return nil, fmt.Errorf("kernels: %s matrix of %dx%d", m.Type, m.Rows, m.Cols)
	case m.Cols%info.BlockSize != 0:
		return nil, fmt.Errorf("kernels: %s matrix has %d columns, not a multiple of the block size %d", m.Type, m.Cols, info.BlockSize)
	case m.Data%16 != 0:
		return nil, fmt.Errorf("kernels: %s matrix at %#x is not 16-byte aligned", m.Type, uint64(m.Data))
	}
	return k, nil
}

// ---- activations

// Q8_1Bytes is the size of nTok rows of cols activations in the GPU Q8_1
// layout (matvec.cu): int8 quants [nTok][cols], then from the next 16-byte
// boundary float32 pairs {d, d*sum} [nTok][cols/32].
func Q8_1Bytes(nTok, cols int) int { return align16(nTok*cols) + nTok*cols/32*8 }

func align16(n int) int { return (n + 15) &^ 15 }

// Q8_1 activations may come in two planes: each block of 32 values as its
// int8 rounding (the first plane) and the int8 rounding of what that
// leaves (the residual, the second plane), whose products the matvec
// kernels add. Two planes hold the values to about 1/64000 of a block's
// largest, where one holds them to 1/254: decode products then round
// nearly as float ones (the oracles' margins need it: a model's logits can
// hang on single activations' roundings), for a second dot product per
// weight read. The second planes follow the first as further rows of the
// Q8_1Bytes layout: nTok rows in two planes are laid out as 2*nTok rows,
// row nTok+t the second plane of row t. A second plane's step is its
// first plane's / 254, so that one token's products add the planes'
// integer sums before scaling them (mv_<type>_<ntok>p): a decode step's second
// plane then costs the second plane's dp4a instructions alone.

// Q8_1PlanesBytes is the size of nTok rows of cols activations in planes
// planes (1 or 2).
func Q8_1PlanesBytes(planes, nTok, cols int) int { return Q8_1Bytes(max(planes, 1)*nTok, cols) }

// q8Planes returns the block scales of Q8_1 activations at q (nTok rows of
// cols in planes planes) and where the second plane starts, in values from
// q (0 with one plane).
func q8Planes(q cudadrv.DevicePtr, planes, nTok, cols int) (ds cudadrv.DevicePtr, plane int64, err error) {
	switch planes {
	case 0, 1:
		return q.Add(align16(nTok * cols)), 0, nil
	case 2:
		return q.Add(align16(2 * nTok * cols)), int64(nTok * cols), nil
	}
	return 0, 0, fmt.Errorf("kernels: Q8_1 activations in %d planes (1 or 2)", planes)
}

// QuantizeQ8_1 queues the quantization of x (nTok rows of cols f32 values,
// ldx values apart; cols a multiple of 32) into dst (Q8_1Bytes(nTok, cols)).
func (w *WeightOps) QuantizeQ8_1(s *cudadrv.Stream, x cudadrv.DevicePtr, ldx, nTok, cols int, dst cudadrv.DevicePtr) error {
	return w.QuantizeQ8_1Planes(s, x, ldx, nTok, cols, 1, dst)
}

// QuantizeQ8_1Planes is QuantizeQ8_1 into planes planes (1 or 2) at dst
// (Q8_1PlanesBytes(planes, nTok, cols)).
func (w *WeightOps) QuantizeQ8_1Planes(s *cudadrv.Stream, x cudadrv.DevicePtr, ldx, nTok, cols, planes int, dst cudadrv.DevicePtr) error {
	if cols%32 != 0 || nTok < 1 || ldx < cols {
		return fmt.Errorf("kernels: quantize_q8_1 of %d rows of %d (stride %d): cols must be a multiple of 32", nTok, cols, ldx)
	}
	ds, plane, err := q8Planes(dst, planes, nTok, cols)
	if err != nil {
		return err
	}
	if err := w.matvec.ready(); err != nil {
		return err
	}
	blocks := nTok * cols / 32 // one warp each, 8 per CTA
	return launch(w.quantizeQ8_1, s, grid1(cudadrv.Blocks(blocks, 8), 1), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(x).I64(int64(ldx)).I32(int32(nTok)).I32(int32(cols)).Ptr(dst).Ptr(ds).I64(plane)
	})
}

// F16Stride is the row stride, in values, of f16 activations made by
// ConvertF16 for cols values: cols rounded up to 32 (zero-padded).
func F16Stride(cols int) int { return (cols + 31) &^ 31 }

// F16Bytes is the size of nRows rows of f16 activations of cols values.
func F16Bytes(nRows, cols int) int { return nRows * F16Stride(cols) * 2 }

// ConvertF16 queues the conversion of x (nTok rows of cols f32 values, ldx
// apart) to f16 rows of F16Stride(cols) values at dst, saturating at
// +-65504.
func (w *WeightOps) ConvertF16(s *cudadrv.Stream, x cudadrv.DevicePtr, ldx, nTok, cols int, dst cudadrv.DevicePtr) error {
	return w.convert(s, x, ldx, nTok, cols, 0, 1, dst)
}

// convert is ConvertF16 with an optional gather: row i of dst is row
// perm[i]/actDiv of x.
func (w *WeightOps) convert(s *cudadrv.Stream, x cudadrv.DevicePtr, ldx, nRows, cols int, perm cudadrv.DevicePtr, actDiv int, dst cudadrv.DevicePtr) error {
	if nRows < 1 || cols < 1 || ldx < cols {
		return fmt.Errorf("kernels: convert_f16 of %d rows of %d (stride %d)", nRows, cols, ldx)
	}
	if err := w.matmul.ready(); err != nil {
		return err
	}
	ldh := F16Stride(cols)
	return launch(w.convertF16, s, grid1(nRows*ldh/2, 256), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(x).I64(int64(ldx)).I32(int32(cols)).Ptr(perm).I32(int32(actDiv)).I32(int32(nRows)).Ptr(dst).I32(int32(ldh))
	})
}

// ---- matrix-vector products

// mvMember mirrors struct MvMember of matvec.cu (48 bytes): a further
// matrix of a launch.
type mvMember struct {
	w                            cudadrv.DevicePtr
	out                          cudadrv.DevicePtr
	rowBytes, ldOut, expertBytes int64
	rows, bx0                    int32
}

// mvArgsBytes is the size of struct MvArgs of matvec.cu.
const mvArgsBytes = 208

// mvArgs mirrors struct MvArgs of matvec.cu (natural alignment).
type mvArgs struct {
	w              cudadrv.DevicePtr
	rowBytes       int64
	rows, cols, ks int32
	planeRows      int32 // MvArgs.planeRows: 0, or two planes (act_row)
	xq, xds, x     cudadrv.DevicePtr
	ldx            int64
	ntok           int32
	out            cudadrv.DevicePtr
	ldOut          int64
	ids            cudadrv.DevicePtr
	expertBytes    int64
	actDiv         int32
	nextra         int32
	m              [2]mvMember
}

func (p *mvArgs) encode(b *[mvArgsBytes]byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(p.w))
	le.PutUint64(b[8:], uint64(p.rowBytes))
	le.PutUint32(b[16:], uint32(p.rows))
	le.PutUint32(b[20:], uint32(p.cols))
	le.PutUint32(b[24:], uint32(p.ks))
	le.PutUint32(b[28:], uint32(p.planeRows))
	le.PutUint64(b[32:], uint64(p.xq))
	le.PutUint64(b[40:], uint64(p.xds))
	le.PutUint64(b[48:], uint64(p.x))
	le.PutUint64(b[56:], uint64(p.ldx))
	le.PutUint32(b[64:], uint32(p.ntok))
	le.PutUint32(b[68:], 0)
	le.PutUint64(b[72:], uint64(p.out))
	le.PutUint64(b[80:], uint64(p.ldOut))
	le.PutUint64(b[88:], uint64(p.ids))
	le.PutUint64(b[96:], uint64(p.expertBytes))
	le.PutUint32(b[104:], uint32(p.actDiv))
	le.PutUint32(b[108:], uint32(p.nextra))
	for i, m := range p.m {
		o := 112 + 48*i
		le.PutUint64(b[o:], uint64(m.w))
		le.PutUint64(b[o+8:], uint64(m.out))
		le.PutUint64(b[o+16:], uint64(m.rowBytes))
		le.PutUint64(b[o+24:], uint64(m.ldOut))
		le.PutUint64(b[o+32:], uint64(m.expertBytes))
		le.PutUint32(b[o+40:], uint32(m.rows))
		le.PutUint32(b[o+44:], uint32(m.bx0))
	}
}

const mvWarps = 4 // MV_WARPS

// layCTAs gives each matrix of a launch (p's own, then its extra members)
// its range of blockIdx.x, perCTA rows a block, and returns the blocks in
// all: the members' bx0 (mv_member in matvec.cu).
func (p *mvArgs) layCTAs(perCTA int) int {
	bx := (int(p.rows) + perCTA - 1) / perCTA
	for i := range p.m[:p.nextra] {
		p.m[i].bx0 = int32(bx)
		bx += (int(p.m[i].rows) + perCTA - 1) / perCTA
	}
	return bx
}

const mvtWarps = 4 // MVT_WARPS

// mvLaunch picks the kernel for nTok (<= 8) tokens and the K split, and
// queues problems matvecs of p.rows rows (and of each extra member's rows,
// p.nextra of them, in the same launch).
func (w *WeightOps) mvLaunch(s *cudadrv.Stream, k *typeKernels, m Matrix, p *mvArgs, nTok, problems int) error {
	if err := w.matvec.ready(); err != nil {
		return err
	}
	var f *cudadrv.Function
	ntok := 1
	for i, nt := range []int{1, 2, 4, 8} {
		if nTok <= nt {
			f, ntok = k.mv[i], nt
			break
		}
	}
	if f == nil {
		return fmt.Errorf("kernels: matvec of %d tokens (at most %d)", nTok, MatVecMaxTokens)
	}
	rows := 2 // MV_R
	if ntok == 1 {
		switch {
		case w.mvRows == 1 && k.mvR1 != nil:
			f, rows = k.mvR1, 1
		case w.mvRows == 4 && k.mvR4 != nil:
			f, rows = k.mvR4, 4
		}
	}
	return w.mvLaunchRows(s, f, rows, m, p, problems)
}

// tokIndex is the index in {1, 2, 4, 8} of the fewest kernel tokens that
// hold n (n <= 8).
func tokIndex(n int) int {
	i := 0
	for 1<<i < n {
		i++
	}
	return i
}

// mvLaunchWith queues kernel f, of MV_R rows a row group, as mvLaunch
// would.
func (w *WeightOps) mvLaunchWith(s *cudadrv.Stream, f *cudadrv.Function, m Matrix, p *mvArgs, problems int) error {
	if err := w.matvec.ready(); err != nil {
		return err
	}
	return w.mvLaunchRows(s, f, 2, m, p, problems)
}

// mvLaunchRows picks the K split for kernel f of rows rows a row group
// and queues it.
func (w *WeightOps) mvLaunchRows(s *cudadrv.Stream, f *cudadrv.Function, rows int, m Matrix, p *mvArgs, problems int) error {
	// Chunks of a row: 1024 values for the quantized types, 1 KiB of
	// weights for the float ones.
	chunkVals := 1024
	switch m.Type {
	case gguf.TypeF32:
		chunkVals = 256
	case gguf.TypeF16, gguf.TypeBF16:
		chunkVals = 512
	}
	nchunk := (m.Cols + chunkVals - 1) / chunkVals
	allRows := m.Rows
	for _, e := range p.m[:p.nextra] {
		allRows += (int(e.rows) + rows - 1) / rows * rows
	}
	groups := (allRows + rows - 1) / rows * problems
	ks := w.mvKS
	if ks == 0 {
		ks = mvSplit(groups, nchunk, w.sms, m.Type == gguf.TypeQ4_K || m.Type == gguf.TypeQ5_K)
	}
	p.ks = int32(ks)
	grid := cudadrv.Dim3{X: uint32(p.layCTAs(mvWarps / ks * rows)), Y: uint32(problems), Z: 1}
	var b [mvArgsBytes]byte
	p.encode(&b)
	return launch(f, s, grid, cudadrv.D1(32*mvWarps), 0, func(a *cudadrv.Args) { a.Bytes(b[:]) })
}

// mvSplit picks the number of warps that share a row (1, 2 or 4) for
// groups row groups of nchunk chunks on sms multiprocessors. Measured on
// an H200 (docs/bench/gpu-kernels.md in the git history): with enough row groups to give every
// multiprocessor 24 warps, whole rows per warp stream best; otherwise rows
// split only as far as it takes to reach half that, since an uneven split
// (5 chunks over 2 or 4 warps) idles warps. Long rows (over 8 chunks) of
// the staged kernels split 4 ways (their loads run only one chunk ahead);
// the direct Q4_K/Q5_K kernels (direct) keep whole rows there too.
func mvSplit(groups, nchunk, sms int, direct bool) int {
	target := 24 * sms
	ks := 1
	switch {
	case groups >= target:
	case nchunk <= 8 || direct:
		for ks < mvWarps && groups*ks < target/2 {
			ks *= 2
		}
	default:
		ks = mvWarps
	}
	for ks > 1 && ks > nchunk {
		ks /= 2
	}
	return ks
}

// MatVecQ8_1 queues out[t][r] = W[r] . xq[t] for t < nTok <=
// MatVecQ8_1MaxTokens on the integer path: m a quantized type, xq nTok
// rows of m.Cols activations from QuantizeQ8_1, out rows ldOut floats
// apart. Up to 8 tokens take one matvec launch; more take the tensor-core
// kernels where the type and the GPU have them (mvtUse), else matvec
// launches of 8 tokens. It is MatVecQ8_1Group of one matrix.
func (w *WeightOps) MatVecQ8_1(s *cudadrv.Stream, m Matrix, xq cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error {
	if isFloat(m.Type) {
		return fmt.Errorf("kernels: MatVecQ8_1 of %s weights: use MatVecF32", m.Type)
	}
	return w.MatVecQ8_1Group(s, []Matrix{m}, xq, nTok, []cudadrv.DevicePtr{out}, []int{ldOut})
}

// mvtTokens are the token counts of the mvt_ kernels (matvec.cu): 1, 2
// and 4 fragments of 8 tokens. More tokens take them in runs of 32.
var mvtTokens = [...]int{8, 16, 32}

// mvtTypes are the weight types with mvt_ kernels, and the fewest tokens
// from which they beat the matvec in runs of 8 on an H200
// (BenchmarkDecodeBatch): Q4_K's from 4 tokens, Q6_K's (twelve 2-byte
// loads a row and super-block) from 9.
var mvtTypes = map[gguf.Type]int{gguf.TypeQ4_K: 4, gguf.TypeQ6_K: 9}

// mvt2Rows: launches of at least this many rows (all members together)
// take mvt2_, which gives each warp two 16-row tiles: half the activation
// loads for each weight, half the warps.
const mvt2Rows = 12288

// SetDecodeMMA sets the fewest tokens of a decode product that take the
// tensor-core kernels (mvt_) instead of the matvec in runs of 8: 0 turns
// them off, a negative count restores each type's own (mvtTypes).
// The device's executors share the WeightOps: the setting is atomic.
func (w *WeightOps) SetDecodeMMA(fewest int) { w.mvtMin.Store(int32(min(max(fewest, -1), 1<<30))) }

// SetBatchPlanes sets whether products of several rows in two Q8_1 planes
// read both (true) or the first alone (false, the default). A second
// plane cost 8 concurrent decode streams of Qwen3-14B about a third of
// their rate on an H200 (601.9 against 880.7 t/s: the tensor-core kernels
// take it as 8 more tokens), where one stream pays 7% (194 against 209).
// The kernels' tests turn it on, to check the batched two-plane kernels.
func (w *WeightOps) SetBatchPlanes(both bool) { w.batchPlanes.Store(both) }

// BatchPlanes reports SetBatchPlanes' setting.
func (w *WeightOps) BatchPlanes() bool { return w.batchPlanes.Load() }

// mvtUse reports whether a product of nTok tokens of k's type takes the
// mvt_ kernels.
func (w *WeightOps) mvtUse(k *typeKernels, nTok int) bool {
	fewest := int(w.mvtMin.Load())
	if fewest < 0 {
		fewest = k.mvtMin
	}
	return w.tensorCoreInt8 && k.mvt[0][0] != nil && fewest > 0 && nTok >= fewest
}

// mvtLaunch queues the mvt_ kernels for nTok tokens (in runs of 32) over
// p's matrix and its extra members: each warp group of a CTA owns 16 or 32
// rows (mvt_, mvt2_), split over K among its ks warps.
func (w *WeightOps) mvtLaunch(s *cudadrv.Stream, k *typeKernels, p *mvArgs, nTok int) error {
	if err := w.matvec.ready(); err != nil {
		return err
	}
	allRows := int(p.rows)
	for _, e := range p.m[:p.nextra] {
		allRows += int(e.rows)
	}
	mt := 0
	if allRows >= mvt2Rows {
		mt = 1
	}
	rowsPerGroup := 16 << mt
	tiles := (int(p.rows) + rowsPerGroup - 1) / rowsPerGroup
	for _, e := range p.m[:p.nextra] {
		tiles += (int(e.rows) + rowsPerGroup - 1) / rowsPerGroup
	}
	cols := int(p.cols)
	xq, xds := p.xq, p.xds
	out0, outs := p.out, [2]cudadrv.DevicePtr{p.m[0].out, p.m[1].out}
	// Two planes: a launch's tokens are its rows' first planes, then
	// their second planes (act_row), so a run takes half the rows.
	per, vt := mvtTokens[len(mvtTokens)-1], 1
	if p.planeRows > 0 {
		per, vt = per/2, 2
	}
	for t0 := 0; t0 < nTok; t0 += per {
		n := min(per, nTok-t0)
		var f *cudadrv.Function
		for i, nt := range mvtTokens {
			if vt*n <= nt {
				f = k.mvt[mt][i]
				break
			}
		}
		ks := w.mvKS
		if ks == 0 {
			ks = mvtSplit(tiles, cols/256, w.sms*mvtBlocksPerSM(vt*n, mt))
		}
		q := *p
		q.ks, q.ntok = int32(ks), int32(vt*n)
		q.xq, q.xds = xq.Add(t0*cols), xds.Add(t0*cols/32*8)
		q.out = out0.Add(4 * t0 * int(p.ldOut))
		for i := range q.m[:q.nextra] {
			q.m[i].out = outs[i].Add(4 * t0 * int(q.m[i].ldOut))
		}
		bx := q.layCTAs(mvtWarps / ks * rowsPerGroup)
		var b [mvArgsBytes]byte
		q.encode(&b)
		if err := launch(f, s, cudadrv.Dim3{X: uint32(bx), Y: 1, Z: 1}, cudadrv.D1(32*mvtWarps), 0, func(a *cudadrv.Args) { a.Bytes(b[:]) }); err != nil {
			return err
		}
	}
	return nil
}

// mvtBlocksPerSM is the resident CTAs per multiprocessor of the mvt_
// kernel for n tokens (mt 0) or of mvt2_ (mt 1): their launch bounds
// (MVT_ALL in matvec.cu).
func mvtBlocksPerSM(n, mt int) int {
	if mt == 1 && n > 16 {
		return 3
	}
	return 4
}

// mvtSplit picks the warps that share a row group's super-blocks (1, 2 or
// 4) for tiles row groups of nsb super-blocks on slots resident CTAs: the
// fewest rounds of CTAs times each CTA's super-blocks (plus one for its
// start and its sums), so that a last, partial round of CTAs costs little.
func mvtSplit(tiles, nsb, slots int) int {
	best, bestCost := mvtWarps, 0
	for _, ks := range []int{4, 2, 1} {
		ctas := (tiles + mvtWarps/ks - 1) / (mvtWarps / ks)
		rounds := (ctas + slots - 1) / slots
		cost := rounds * ((nsb+ks-1)/ks + 1)
		if bestCost == 0 || cost < bestCost {
			best, bestCost = ks, cost
		}
	}
	return best
}

// MaxMatVecGroup is the most matrices MatVecQ8_1Group and
// MoEMatVecQ8_1Group take in one launch.
const MaxMatVecGroup = 3

// MatVecQ8_1Group is MatVecQ8_1 for up to MaxMatVecGroup matrices of one
// quantized type and width reading the same activations xq, in one launch
// (Q, K and V of a decode step): outs[i] rows ldOuts[i] apart.
func (w *WeightOps) MatVecQ8_1Group(s *cudadrv.Stream, ms []Matrix, xq cudadrv.DevicePtr, nTok int, outs []cudadrv.DevicePtr, ldOuts []int) error {
	return w.MatVecQ8_1GroupPlanes(s, ms, xq, 1, nTok, outs, ldOuts)
}

// MatVecQ8_1GroupPlanes is MatVecQ8_1Group of activations in planes planes
// (QuantizeQ8_1Planes): with two, each weight read takes both planes'
// products, and each output is their sum.
func (w *WeightOps) MatVecQ8_1GroupPlanes(s *cudadrv.Stream, ms []Matrix, xq cudadrv.DevicePtr, planes, nTok int, outs []cudadrv.DevicePtr, ldOuts []int) error {
	if len(ms) < 1 || len(ms) > MaxMatVecGroup || len(outs) != len(ms) || len(ldOuts) != len(ms) {
		return fmt.Errorf("kernels: matvec group of %d matrices (1 to %d, an output each)", len(ms), MaxMatVecGroup)
	}
	m := ms[0]
	k, err := w.kernels(m)
	if err != nil {
		return err
	}
	if isFloat(m.Type) {
		return fmt.Errorf("kernels: MatVecQ8_1Group of %s weights", m.Type)
	}
	for _, e := range ms[1:] {
		if e.Type != m.Type || e.Cols != m.Cols {
			return fmt.Errorf("kernels: matvec group of %s x %d with %s x %d", m.Type, m.Cols, e.Type, e.Cols)
		}
	}
	if nTok > MatVecQ8_1MaxTokens {
		return fmt.Errorf("kernels: MatVecQ8_1Group of %d tokens (at most %d)", nTok, MatVecQ8_1MaxTokens)
	}
	xds, plane, err := q8Planes(xq, planes, nTok, m.Cols)
	if err != nil {
		return err
	}
	if plane > 0 && nTok > 1 && !w.batchPlanes.Load() {
		// Batched decode reads the first plane alone (SetBatchPlanes).
		// The first plane's scales come first, so xds holds.
		plane, planes = 0, 1
	}
	planeRows := 0
	if plane > 0 {
		planeRows = nTok
	}
	vt := max(planes, 1) // the kernels' tokens a row
	// The tensor cores take the second planes as further tokens, from the
	// same count of rows as one plane: up to 4 rows, both planes fit the
	// 8 tokens of one fragment.
	if w.mvtUse(k, nTok) {
		p := mvArgs{w: m.Data, rowBytes: int64(m.RowBytes()), rows: int32(m.Rows), cols: int32(m.Cols),
			planeRows: int32(planeRows), xq: xq, xds: xds, out: outs[0], ldOut: int64(ldOuts[0]), actDiv: 1}
		for i, e := range ms[1:] {
			p.m[i] = mvMember{w: e.Data, out: outs[i+1], rowBytes: int64(e.RowBytes()), ldOut: int64(ldOuts[i+1]), rows: int32(e.Rows)}
		}
		p.nextra = int32(len(ms) - 1)
		return w.mvtLaunch(s, k, &p, nTok)
	}
	if vt == 2 && k.mvp[0] != nil {
		// Runs of MatVecMaxTokens rows, each with its second plane
		// nTok rows on (mv_<type>_<ntok>p add the planes' integer sums).
		for t0 := 0; t0 < nTok; t0 += MatVecMaxTokens {
			n := min(MatVecMaxTokens, nTok-t0)
			p := mvArgs{w: m.Data, rowBytes: int64(m.RowBytes()), rows: int32(m.Rows), cols: int32(m.Cols),
				planeRows: int32(nTok), xq: xq.Add(t0 * m.Cols), xds: xds.Add(t0 * m.Cols / 32 * 8), ntok: int32(n),
				out: outs[0].Add(4 * t0 * ldOuts[0]), ldOut: int64(ldOuts[0]), actDiv: 1}
			for i, e := range ms[1:] {
				p.m[i] = mvMember{w: e.Data, out: outs[i+1].Add(4 * t0 * ldOuts[i+1]), rowBytes: int64(e.RowBytes()), ldOut: int64(ldOuts[i+1]), rows: int32(e.Rows)}
			}
			p.nextra = int32(len(ms) - 1)
			if err := w.mvLaunchWith(s, k.mvp[tokIndex(n)], m, &p, 1); err != nil {
				return err
			}
		}
		return nil
	}
	// Runs of MatVecMaxTokens kernel tokens: with two planes, half as
	// many rows, their second planes planeRows rows on.
	per := MatVecMaxTokens / vt
	for t0 := 0; t0 < nTok; t0 += per {
		n := min(per, nTok-t0)
		p := mvArgs{w: m.Data, rowBytes: int64(m.RowBytes()), rows: int32(m.Rows), cols: int32(m.Cols),
			planeRows: int32(planeRows), xq: xq.Add(t0 * m.Cols), xds: xds.Add(t0 * m.Cols / 32 * 8), ntok: int32(vt * n),
			out: outs[0].Add(4 * t0 * ldOuts[0]), ldOut: int64(ldOuts[0]), actDiv: 1}
		for i, e := range ms[1:] {
			p.m[i] = mvMember{w: e.Data, out: outs[i+1].Add(4 * t0 * ldOuts[i+1]), rowBytes: int64(e.RowBytes()), ldOut: int64(ldOuts[i+1]), rows: int32(e.Rows)}
		}
		p.nextra = int32(len(ms) - 1)
		if err := w.mvLaunch(s, k, m, &p, vt*n, 1); err != nil {
			return err
		}
	}
	return nil
}

// MatVecF32 queues out[t][r] = W[r] . x[t] for t < nTok <= 8 for float
// weights (F32, F16, BF16) and f32 activations x, ldx values apart.
func (w *WeightOps) MatVecF32(s *cudadrv.Stream, m Matrix, x cudadrv.DevicePtr, ldx, nTok int, out cudadrv.DevicePtr, ldOut int) error {
	k, err := w.kernels(m)
	if err != nil {
		return err
	}
	if !isFloat(m.Type) {
		return fmt.Errorf("kernels: MatVecF32 of %s weights: quantize the activations and use MatVecQ8_1", m.Type)
	}
	p := mvArgs{w: m.Data, rowBytes: int64(m.RowBytes()), rows: int32(m.Rows), cols: int32(m.Cols),
		x: x, ldx: int64(ldx), ntok: int32(nTok), out: out, ldOut: int64(ldOut), actDiv: 1}
	return w.mvLaunch(s, k, m, &p, nTok, 1)
}

// ---- tensor-core matrix products

// mmTiles are the token tiles of the tensor-core kernel (MM_BN of the
// kernels mm_, mm64_ and mm32_); every tile is 128 weight rows (MM_BM).
var mmTiles = [3]int{128, 64, 32}

const mmRowTile = 128 // MM_BM

func mmKernelName(bn int, typeName string) string {
	if bn == 128 {
		return "mm_" + typeName
	}
	return fmt.Sprintf("mm%d_%s", bn, typeName)
}

func (k *typeKernels) mmFor(bn int) *cudadrv.Function {
	for i, t := range mmTiles {
		if t == bn {
			return k.mm[i]
		}
	}
	return nil
}

// MatMulF16 queues out[t][r] = W[r] . xh[t] for all t < nTok on the tensor
// cores: xh nTok rows of f16 activations from ConvertF16 (stride
// F16Stride(m.Cols)), any weight type.
func (w *WeightOps) MatMulF16(s *cudadrv.Stream, m Matrix, xh cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error {
	return w.MatMulF16Multi(s, []F16Product{{M: m, Out: out, LdOut: ldOut}}, xh, nTok)
}

// F16Product is one member of MatMulF16Multi: out[t][r] = M[r] . xh[t].
type F16Product struct {
	M     Matrix
	Out   cudadrv.DevicePtr
	LdOut int
}

// MaxF16Products is how many products one MatMulF16Multi launch takes.
const MaxF16Products = 3

// MatMulF16Multi queues up to MaxF16Products products of matrices of one
// type and width on the same f16 activations as one launch: their row
// tiles share the grid, so small matrices (attn_k/v beside attn_q) do not
// each take a partial wave of their own.
func (w *WeightOps) MatMulF16Multi(s *cudadrv.Stream, ps []F16Product, xh cudadrv.DevicePtr, nTok int) error {
	if len(ps) < 1 || len(ps) > MaxF16Products {
		return fmt.Errorf("kernels: %d products in one launch (1 to %d)", len(ps), MaxF16Products)
	}
	m := ps[0].M
	k, err := w.kernels(m)
	if err != nil {
		return err
	}
	if nTok < 1 {
		return fmt.Errorf("kernels: matmul of %d tokens", nTok)
	}
	seg := mmSegments{tile: [2]int{noSegment, noSegment}}
	tiles := cudadrv.Blocks(m.Rows, mmRowTile)
	for i, p := range ps[1:] {
		if _, err := w.kernels(p.M); err != nil {
			return err
		}
		if p.M.Type != m.Type || p.M.Cols != m.Cols {
			return fmt.Errorf("kernels: one launch for a %s %dx%d and a %s %dx%d matrix (one type and width only)",
				m.Type, m.Rows, m.Cols, p.M.Type, p.M.Rows, p.M.Cols)
		}
		seg.p[i], seg.tile[i] = p, tiles
		tiles += cudadrv.Blocks(p.M.Rows, mmRowTile)
	}
	bn := 128
	if w.mmBN != 0 {
		bn = w.mmBN
	}
	grid := cudadrv.Dim3{X: uint32(tiles), Y: uint32(cudadrv.Blocks(nTok, bn)), Z: 1}
	return w.mmLaunch(s, k, bn, m, grid, 0, xh, nTok, 0, 0, 0, ps[0].Out, ps[0].LdOut, &seg)
}

// mmSegments are the second and third matrix of a dense launch (row tiles
// from tile[i] on); noSegment marks an absent one.
type mmSegments struct {
	p    [2]F16Product
	tile [2]int
}

const noSegment = 0x7fffffff

func (w *WeightOps) mmLaunch(s *cudadrv.Stream, k *typeKernels, bn int, m Matrix, grid cudadrv.Dim3, expertBytes int, xh cudadrv.DevicePtr, nTok int, tiles, ntiles, perm, out cudadrv.DevicePtr, ldOut int, seg *mmSegments) error {
	if err := w.matmul.ready(); err != nil {
		return err
	}
	f := k.mmFor(bn)
	if f == nil {
		return fmt.Errorf("kernels: no tensor-core kernel of %d-token tiles", bn)
	}
	return launch(f, s, grid, cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(m.Data).I64(int64(m.RowBytes())).I32(int32(m.Rows)).I32(int32(m.Cols)).I64(int64(expertBytes)).
			Ptr(xh).I32(int32(F16Stride(m.Cols))).I32(int32(nTok)).Ptr(tiles).Ptr(ntiles).Ptr(perm).Ptr(out).I64(int64(ldOut))
		for i := 0; i < 2; i++ {
			if seg == nil || seg.tile[i] == noSegment {
				a.Ptr(0).Ptr(0).I64(0).I32(0).I32(noSegment)
				continue
			}
			p := seg.p[i]
			a.Ptr(p.M.Data).Ptr(p.Out).I64(int64(p.LdOut)).I32(int32(p.M.Rows)).I32(int32(seg.tile[i]))
		}
	})
}

// ---- the dispatcher

// MatMulScratchBytes is the scratch MatMul needs for nTok tokens.
func MatMulScratchBytes(m Matrix, nTok int) int {
	switch {
	case nTok > MatVecMaxTokens:
		return F16Bytes(nTok, m.Cols)
	case isFloat(m.Type):
		return 0
	}
	return Q8_1Bytes(nTok, m.Cols)
}

// MatMul queues out[t][r] = W[r] . x[t] for t < nTok: x holds nTok rows of
// m.Cols f32 activations ldx values apart, out nTok rows ldOut floats
// apart. Up to MatVecMaxTokens tokens it quantizes x to Q8_1 in scratch
// and runs the integer matvec (float weights: the float matvec on x), above
// it converts x to f16 in scratch and runs the tensor-core kernel (the
// engine's prepared path takes the matvec up to MatVecQ8_1MaxTokens:
// runtime/backend/cuda). scratch:
// MatMulScratchBytes(m, nTok) bytes, 16-byte aligned.
func (w *WeightOps) MatMul(s *cudadrv.Stream, m Matrix, x cudadrv.DevicePtr, ldx, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr) error {
	switch {
	case nTok > MatVecMaxTokens:
		if err := w.ConvertF16(s, x, ldx, nTok, m.Cols, scratch); err != nil {
			return err
		}
		return w.MatMulF16(s, m, scratch, nTok, out, ldOut)
	case isFloat(m.Type):
		return w.MatVecF32(s, m, x, ldx, nTok, out, ldOut)
	}
	if err := w.QuantizeQ8_1(s, x, ldx, nTok, m.Cols, scratch); err != nil {
		return err
	}
	return w.MatVecQ8_1(s, m, scratch, nTok, out, ldOut)
}

// ---- embedding rows

// GetRows queues out[i][0:m.Cols] = row ids[i] of m, dequantized to f32,
// for i < n: ids is a device array of n int32 row indices (each in
// [0, m.Rows)), out rows ldOut floats apart. The values are bit-identical
// to ops' Dequantize.
func (w *WeightOps) GetRows(s *cudadrv.Stream, m Matrix, ids cudadrv.DevicePtr, n int, out cudadrv.DevicePtr, ldOut int) error {
	k, err := w.kernels(m)
	if err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("kernels: get_rows of %d rows", n)
	}
	if err := w.matmul.ready(); err != nil {
		return err
	}
	threads := min(256, max(32, (m.Cols/16+31)&^31))
	return launch(k.getRows, s, cudadrv.D1(min(n, 65535)), cudadrv.D1(threads), 0, func(a *cudadrv.Args) {
		a.Ptr(m.Data).I64(int64(m.RowBytes())).I32(int32(m.Cols)).Ptr(ids).I32(int32(n)).Ptr(out).I64(int64(ldOut))
	})
}

// ---- mixture of experts

// MoE describes an expert product: the stack holds NExpert matrices (each
// of Matrix's shape) back to back; token t chose the K experts
// ids[t*K : t*K+K] (a device array of nTok*K int32). Slot p = t*K + j is
// token t's j-th choice. With PerSlot the input of slot p is row p of x
// (nTok*K rows: the down projection after a per-expert activation),
// otherwise row t (the K slots of a token share its input: gate and up).
type MoE struct {
	Matrix
	NExpert int
	K       int
	PerSlot bool
}

// MoEMatVecMaxTokens is the largest token count MoEMatMul computes with
// the matrix-vector kernels, one problem per slot.
const MoEMatVecMaxTokens = 8

func (e MoE) inputRows(nTok int) int {
	if e.PerSlot {
		return nTok * e.K
	}
	return nTok
}

// moeMaxTiles bounds the tile table of nslots slots in tiles of bn: each
// expert's last tile may be partial.
func (e MoE) moeMaxTiles(nslots, bn int) int {
	return cudadrv.Blocks(nslots, bn) + min(e.NExpert, nslots)
}

// moeLayout returns the offsets in the grouped path's scratch of perm
// (nslots int32), tiles (room for the smallest token tile's table: int4s),
// ntiles (int32) and the f16 activations, and the total size.
func (e MoE) moeLayout(nTok int) (perm, tiles, ntiles, xh, total int) {
	nslots := nTok * e.K
	maxTiles := e.moeMaxTiles(nslots, mmTiles[len(mmTiles)-1])
	perm = 0
	tiles = align16(4 * nslots)
	ntiles = tiles + 16*maxTiles
	xh = ntiles + 16
	total = xh + F16Bytes(nslots, e.Cols)
	return
}

// MoEScratchBytes is the scratch MoEMatMul needs for nTok tokens.
func MoEScratchBytes(e MoE, nTok int) int {
	if nTok > MoEMatVecMaxTokens {
		_, _, _, _, total := e.moeLayout(nTok)
		return total
	}
	if isFloat(e.Type) {
		return 0
	}
	return Q8_1Bytes(e.inputRows(nTok), e.Cols)
}

// maxMoEExperts bounds NExpert: moe_group keeps 3 ints per expert in 48 KiB
// of shared memory.
const maxMoEExperts = 4096

// MoEMatMul queues, for every slot p = t*K + j of nTok tokens, out[p][r] =
// W_e[r] . input(p) with e = ids[p]: only the chosen experts' weights are
// read. x holds the inputs (e.PerSlot: nTok*K rows, else nTok rows) of
// e.Cols f32 values ldx apart; out has nTok*K rows ldOut floats apart.
// Ids outside [0, NExpert) leave their slot's output unwritten. Up to
// MoEMatVecMaxTokens tokens every slot is a matvec (integer for quantized
// weights); above, the slots are grouped by expert on the device
// (moe_group) and each expert's group runs through the tensor-core kernel.
// scratch: MoEScratchBytes(e, nTok), 16-byte aligned.
func (w *WeightOps) MoEMatMul(s *cudadrv.Stream, e MoE, ids cudadrv.DevicePtr, x cudadrv.DevicePtr, ldx, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr) error {
	return w.MoEMatMulReusing(s, e, ids, x, ldx, nTok, out, ldOut, scratch, MoEReuseNothing)
}

// MoEReuse says what of the grouped path's scratch a MoEMatMulReusing
// takes from the MoEMatMul queued before it on the same stream and
// scratch, with the same ids, nTok, K and NExpert (an MoE layer's gate,
// up and down): the grouping is the same for all three, and gate and up
// read the same gathered input.
type MoEReuse int

const (
	MoEReuseNothing MoEReuse = iota
	MoEReuseGroups           // moe_group's slot order and tile table
	MoEReuseInput            // those and the gathered f16 input (same x, ldx, Cols, PerSlot)
)

// MoEMatMulReusing is MoEMatMul that skips, above MoEMatVecMaxTokens
// tokens, the grouping (and the input's conversion) the previous call
// left in scratch, as reuse says.
func (w *WeightOps) MoEMatMulReusing(s *cudadrv.Stream, e MoE, ids cudadrv.DevicePtr, x cudadrv.DevicePtr, ldx, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr, reuse MoEReuse) error {
	k, err := w.kernels(e.Matrix)
	if err != nil {
		return err
	}
	if e.K < 1 || e.NExpert < 1 || e.NExpert > maxMoEExperts || nTok < 1 {
		return fmt.Errorf("kernels: MoE of %d experts, %d per token, %d tokens", e.NExpert, e.K, nTok)
	}
	actDiv := e.K
	if e.PerSlot {
		actDiv = 1
	}
	nslots := nTok * e.K
	if nTok <= MoEMatVecMaxTokens {
		p := mvArgs{w: e.Data, rowBytes: int64(e.RowBytes()), rows: int32(e.Rows), cols: int32(e.Cols),
			ntok: 1, out: out, ldOut: int64(ldOut), ids: ids, expertBytes: int64(e.Bytes()), actDiv: int32(actDiv)}
		if isFloat(e.Type) {
			p.x, p.ldx = x, int64(ldx)
		} else {
			rows := e.inputRows(nTok)
			if err := w.QuantizeQ8_1(s, x, ldx, rows, e.Cols, scratch); err != nil {
				return err
			}
			p.xq, p.xds = scratch, scratch.Add(align16(rows*e.Cols))
		}
		return w.mvLaunch(s, k, e.Matrix, &p, 1, nslots)
	}
	permOff, tilesOff, ntilesOff, xhOff, _ := e.moeLayout(nTok)
	bn := moeTile(nslots, e.NExpert)
	if w.moeBN != 0 {
		bn = w.moeBN
	}
	perm, tiles, ntiles, xh := scratch.Add(permOff), scratch.Add(tilesOff), scratch.Add(ntilesOff), scratch.Add(xhOff)
	if err := w.matmul.ready(); err != nil {
		return err
	}
	if reuse < MoEReuseGroups {
		err = launch(w.moeGroup, s, cudadrv.D1(1), cudadrv.D1(1024), 12*e.NExpert, func(a *cudadrv.Args) {
			a.Ptr(ids).I32(int32(nslots)).I32(int32(e.NExpert)).I32(int32(bn)).Ptr(perm).Ptr(tiles).Ptr(ntiles)
		})
		if err != nil {
			return err
		}
	}
	if reuse < MoEReuseInput {
		if err := w.convert(s, x, ldx, nslots, e.Cols, perm, actDiv, xh); err != nil {
			return err
		}
	}
	grid := cudadrv.Dim3{X: uint32(cudadrv.Blocks(e.Rows, mmRowTile)), Y: uint32(e.moeMaxTiles(nslots, bn)), Z: 1}
	return w.mmLaunch(s, k, bn, e.Matrix, grid, e.Bytes(), xh, nslots, tiles, ntiles, perm, out, ldOut, nil)
}

// moeTile is the token tile of the grouped expert products: the smallest
// of mmTiles that holds twice the average expert's slots (nslots/nExpert:
// 32 of 4096 for Qwen3-30B-A3B at 512 tokens, so 64). Counts scatter
// around the average, and an expert that needs a second tile has its
// weights dequantized twice; tokens past a tile's count skip their MMAs,
// so a tile that is too large costs little.
func moeTile(nslots, nExpert int) int {
	avg := cudadrv.Blocks(nslots, nExpert)
	for i := len(mmTiles) - 1; i > 0; i-- {
		if 2*avg <= mmTiles[i] {
			return mmTiles[i]
		}
	}
	return mmTiles[0]
}
