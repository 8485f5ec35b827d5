package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/atsinfer/ats/cudadrv"
)

// Attention holds the kernels of attention.cu (KV-cache writes, flash
// attention over an f16 cache, the split-K combine) for one context.
type Attention struct {
	lazyModule
	store   *cudadrv.Function
	combine *cudadrv.Function
	attn    map[int]*cudadrv.Function // by values per lane: ceil(headSize/32)
	mma     map[int]*cudadrv.Function // tensor-core prefill kernels by head size
	dec     map[int]*cudadrv.Function // decode kernels by head size
	// optin is the shared memory a block of the attention kernels may use
	// (the device's opt-in limit, granted at load): decode takes larger
	// tiles with it.
	optin int
	// simt forces the CUDA-core kernel for every prefill launch, tiled
	// attn_f16 for decode (EnvAttention).
	simt, tiled bool
}

// EnvAttention set to "simt" makes every prefill launch use the CUDA-core
// kernel (attn_f16), also where the tensor-core one would run; "tile" makes
// decode use attn_f16 instead of attn_dec: for A/B measurements of each.
const EnvAttention = "ATS_GPU_ATTN"

// NewAttention prepares attention.cu's kernels for the context's device;
// the module loads at the first launch.
func NewAttention(ctx *cudadrv.Context) (*Attention, error) {
	optin, err := ctx.Device().Attribute(cudadrv.AttrMaxSharedMemoryPerBlockOptin)
	if err != nil {
		return nil, err
	}
	env := os.Getenv(EnvAttention)
	k := &Attention{attn: map[int]*cudadrv.Function{}, mma: map[int]*cudadrv.Function{}, dec: map[int]*cudadrv.Function{},
		optin: max(attnShared, optin), simt: env == "simt", tiled: env == "tile"}
	if err := k.prepare(ctx, "attention", k.bind); err != nil {
		return nil, err
	}
	return k, nil
}

// LoadAttention is NewAttention with the module loaded now.
func LoadAttention(ctx *cudadrv.Context) (*Attention, error) { return loadNow(NewAttention(ctx)) }

// bind looks the kernels up in m and grants the attention kernels the
// opt-in shared memory: once, at load, so that the launches stay
// capturable.
func (k *Attention) bind(m *cudadrv.Module) error {
	if err := lookup(m, map[string]**cudadrv.Function{"kv_store_f16": &k.store, "attn_combine": &k.combine}); err != nil {
		return err
	}
	for _, d := range attnDPL {
		f, err := m.Function(fmt.Sprintf("attn_f16_d%d", d))
		if err == nil && k.optin > attnShared {
			err = f.SetAttribute(cudadrv.FuncMaxDynamicSharedSizeBytes, k.optin)
		}
		if err != nil {
			return err
		}
		k.attn[d] = f
	}
	for _, hs := range attnMMAHeadSizes {
		f, err := m.Function(fmt.Sprintf("attn_mma_d%d", hs))
		if err == nil && k.optin > attnShared {
			err = f.SetAttribute(cudadrv.FuncMaxDynamicSharedSizeBytes, k.optin)
		}
		if err != nil {
			return err
		}
		k.mma[hs] = f
	}
	for _, hs := range attnDecHeadSizes {
		f, err := m.Function(fmt.Sprintf("attn_dec_e%d", hs/32))
		if err != nil {
			return err
		}
		k.dec[hs] = f
	}
	return nil
}

// attnDPL are the instantiated values per lane (head sizes up to 32*d).
var attnDPL = []int{1, 2, 3, 4, 8}

// The kernel's fixed shape (attention.cu): query rows per block, threads.
const (
	attnRows    = 16
	attnThreads = 128
	// attnShared is the shared memory a block may use without opting in.
	attnShared = 48 << 10
)

// Store queues writing nTok rows of keys and values (k, v: [nTok][width]
// float) as f16 into rows pos0.. of the caches kc, vc ([ctx][width] f16),
// pos0 read on the device from an int32.
func (k *Attention) Store(s *cudadrv.Stream, kc, vc, kSrc, vSrc cudadrv.DevicePtr, width int, pos0 cudadrv.DevicePtr, nTok int) error {
	n := width * nTok
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.store, s, grid1(n, 256), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(kc).Ptr(vc).Ptr(kSrc).Ptr(vSrc).I32(int32(width)).Ptr(pos0).I32(int32(nTok))
	})
}

// AttnArgs describe one attention launch: causal GQA of NTok query rows at
// positions pos0.. over cache rows 0..pos0+t.
type AttnArgs struct {
	Out, Q cudadrv.DevicePtr // [NTok][NHeads*HeadSize] float
	K, V   cudadrv.DevicePtr // the layer's cache, [ctx][NKV*HeadSize] f16
	Pos0   cudadrv.DevicePtr // device int32

	NTok, NHeads, NKV, HeadSize int
	Scale                       float32

	// Splits > 1 divides the cache positions into chunks of Chunk, one
	// block column each, combined afterwards (split-K, for decode over
	// long contexts); Part and ML are their scratch (AttnScratch). Splits
	// and Chunk must cover every position that can be attended, up to the
	// cache size: a graph captured with them replays at any position.
	Splits, Chunk int
	Part, ML      cudadrv.DevicePtr

	// SIMT makes this launch use the CUDA-core kernel where the
	// tensor-core one would apply (tests and benchmarks compare the two).
	SIMT bool
	// Tiled makes a decode launch use attn_f16 where attn_dec would
	// apply (likewise).
	Tiled bool

	// Q8, when set, also receives Out in the Q8_1 layout of QuantizeQ8_1
	// (Q8_1Bytes(NTok, NHeads*HeadSize); HeadSize % 32 == 0): the input of
	// the output projection, without a launch of its own.
	Q8 cudadrv.DevicePtr
}

// AttnScratch is the bytes of Part and ML for a launch of nTok rows and
// the given splits.
func AttnScratch(nTok, nHeads, headSize, splits int) (part, ml int) {
	rows := splits * nTok * nHeads
	return 4 * rows * headSize, 8 * rows
}

// DecodeSplits chooses the split-K layout for decoding over a cache of ctx
// positions: about two blocks per multiprocessor when the cache is full,
// chunks of at least 64 positions. Short contexts leave the later splits
// empty; they exit at once.
func DecodeSplits(ctx, nKV, multiprocessors int) (splits, chunk int) {
	want := max(1, 2*multiprocessors/max(1, nKV))
	chunk = max(64, (ctx+want-1)/want)
	chunk = (chunk + 63) &^ 63
	return (ctx + chunk - 1) / chunk, chunk
}

// attnPlan is the launch shape of a head size and group.
type attnPlan struct {
	dpl, hb, bk, tpr, shared int
}

// planAttention picks the kernel variant, heads per block and tile for
// nTok query rows. Tiles fit 48 KiB of shared memory (several blocks per
// multiprocessor for prefill), except for decode, which has few blocks and
// a serial walk over the cache per block: it takes the largest tile that
// fits limit, the fewer the tiles the shorter the walk.
func planAttention(nHeads, nKV, hs, nTok, limit int) (attnPlan, error) {
	if hs <= 0 || hs%4 != 0 || hs > 32*attnDPL[len(attnDPL)-1] || nKV <= 0 || nHeads%nKV != 0 {
		return attnPlan{}, fmt.Errorf("kernels: attention of %d heads over %d KV heads of %d: head size must be a multiple of 4 up to 256", nHeads, nKV, hs)
	}
	var p attnPlan
	for _, d := range attnDPL {
		if 32*d >= hs {
			p.dpl = d
			break
		}
	}
	// Heads per block: the largest divisor of the group that fits the rows,
	// so a block's K/V tile serves as many heads as possible.
	group := nHeads / nKV
	for hb := min(group, attnRows); hb >= 1; hb-- {
		if group%hb == 0 {
			p.hb = hb
			break
		}
	}
	// A block has min(nTok, rows/hb) tokens of hb heads; with at most 8
	// rows, 16 threads share each row's scores.
	p.tpr = 8
	if min(nTok, attnRows/p.hb)*p.hb <= attnRows/2 {
		p.tpr = 16
	}
	budget := attnShared
	if nTok == 1 {
		budget = limit
	}
	for _, bk := range []int{64, 32, 16, 8} {
		floats := attnRows*(hs+1) + bk*(hs+1) + bk*hs + attnRows*bk + 3*attnRows
		if 4*floats <= budget {
			p.bk, p.shared = bk, 4*floats
			break
		}
	}
	if p.bk == 0 {
		return attnPlan{}, fmt.Errorf("kernels: attention head size %d needs more shared memory than %d bytes", hs, budget)
	}
	return p, nil
}

// The tensor-core kernels (attn_mma_d64, attn_mma_d128 of attention.cu):
// head sizes, query rows and threads per block, cache positions per tile.
var attnMMAHeadSizes = []int{64, 128}

const (
	attnMMARows    = 64
	attnMMAThreads = 128
	attnMMATile    = 64
)

// attnMMAShared is the tensor-core kernel's shared memory for head size hs:
// two buffers of K and V tiles of attnMMATile rows of hs+8 halves.
func attnMMAShared(hs int) int { return 4 * attnMMATile * (hs + 8) * 2 }

// attnMMAPlan is the tensor-core kernel's launch shape.
type attnMMAPlan struct {
	hb, shared int
}

// planAttentionMMA says whether the tensor-core kernel takes the launch a
// on a device granting optin bytes of shared memory a block, and with
// which heads per block, or why not. It takes prefill: one split, head
// size 64 or 128, at least half of a block's 64 query rows used (decode
// and short batches stay on the CUDA-core kernel, tuned for them), its
// shared memory within optin (head size 128 needs 68 KiB: not on CC 7.5,
// whose limit is 64 KiB) and 16-byte aligned Q and caches (vector loads).
// The reasons are constants: Run asks at every launch, which must not
// allocate.
func planAttentionMMA(a *AttnArgs, optin int) (attnMMAPlan, string) {
	var p attnMMAPlan
	switch {
	case a.SIMT:
		return p, "the CUDA-core kernel was asked for"
	case a.NTok < 2:
		return p, "decode"
	case a.Splits > 1:
		return p, "split-K"
	case a.HeadSize != 64 && a.HeadSize != 128:
		return p, "head size not 64 or 128"
	case a.NKV <= 0 || a.NHeads%a.NKV != 0:
		return p, "heads not a multiple of the KV heads"
	case attnMMAShared(a.HeadSize) > optin:
		return p, "its shared memory is over the device's limit"
	case a.Q%16 != 0 || a.K%16 != 0 || a.V%16 != 0 || a.Out%8 != 0:
		return p, "unaligned buffers"
	}
	// Heads per block: the largest power of two dividing the group (so
	// that it divides the 64 rows): a block's rows are tokens of hb heads
	// that share the K/V tiles, filled best when prompts are short.
	group := a.NHeads / a.NKV
	p.hb = min(group&-group, attnMMARows)
	if rows := min(a.NTok, attnMMARows/p.hb) * p.hb; 2*rows < attnMMARows {
		return p, "fewer than 32 query rows a block"
	}
	p.shared = attnMMAShared(a.HeadSize)
	return p, ""
}

// The decode kernels (attn_dec_e* of attention.cu): head sizes 32*E, warps
// a block.
var attnDecHeadSizes = []int{32, 64, 128, 256}

const attnDecThreads = 8 * 32

// planAttentionDec says whether the decode kernel takes the launch a, or
// why not: one query row, a head size it has, Tiled not asked for, caches
// 16-byte aligned (vector loads). The reasons are constants, as
// planAttentionMMA's.
func planAttentionDec(a *AttnArgs) string {
	switch {
	case a.Tiled:
		return "the tiled kernel was asked for"
	case a.NTok != 1:
		return "not decode"
	case a.HeadSize != 32 && a.HeadSize != 64 && a.HeadSize != 128 && a.HeadSize != 256:
		return "head size not 32, 64, 128 or 256"
	case a.NKV <= 0 || a.NHeads%a.NKV != 0:
		return "heads not a multiple of the KV heads"
	case a.K%16 != 0 || a.V%16 != 0:
		return "unaligned caches"
	}
	return ""
}

// Decode says whether Run takes the decode kernel attn_dec for a, and if
// not, why.
func (k *Attention) Decode(a *AttnArgs) (bool, string) {
	if k.tiled {
		return false, EnvAttention + "=tile"
	}
	why := planAttentionDec(a)
	return why == "", why
}

// TensorCores says whether Run takes the tensor-core kernel for a, and if
// not, why.
func (k *Attention) TensorCores(a *AttnArgs) (bool, string) {
	if k.simt {
		return false, EnvAttention + "=simt"
	}
	_, why := planAttentionMMA(a, k.optin)
	return why == "", why
}

// TensorCoreHeadSize says whether this context runs the tensor-core kernel
// for prefill with heads of hs (the head size is one it has, its shared
// memory fits, EnvAttention does not forbid it).
func (k *Attention) TensorCoreHeadSize(hs int) bool {
	return !k.simt && (hs == 64 || hs == 128) && attnMMAShared(hs) <= k.optin
}

// Run queues the attention of a.NTok query rows: on the tensor cores for
// prefill where planAttentionMMA allows it, with attn_dec for decode where
// planAttentionDec allows it, else with attn_f16. With a.Splits > 1 it
// queues the split kernel and the combine.
func (k *Attention) Run(s *cudadrv.Stream, a *AttnArgs) error {
	if a.NTok == 0 {
		return nil
	}
	if !k.simt {
		if mp, why := planAttentionMMA(a, k.optin); why == "" {
			return k.runMMA(s, a, mp)
		}
	}
	splits, chunk := a.Splits, a.Chunk
	if splits <= 1 {
		splits, chunk = 1, math.MaxInt32
	} else if chunk <= 0 || a.Part == 0 || a.ML == 0 {
		return fmt.Errorf("kernels: split attention needs a chunk size and scratch")
	}
	q8, q8ds, err := attnQ8(a)
	if err != nil {
		return err
	}
	if !k.tiled && planAttentionDec(a) == "" {
		// Decode: a block per head and split.
		b := attnParams(a, 1, 0, 0, chunk, splits, q8, q8ds)
		if err := k.ready(); err != nil {
			return err
		}
		grid := cudadrv.Dim3{X: 1, Y: uint32(a.NHeads), Z: uint32(splits)}
		if err := launch(k.dec[a.HeadSize], s, grid, cudadrv.D1(attnDecThreads), 0, func(args *cudadrv.Args) {
			args.Bytes(b[:])
		}); err != nil {
			return err
		}
	} else {
		p, err := planAttention(a.NHeads, a.NKV, a.HeadSize, a.NTok, k.optin)
		if err != nil {
			return err
		}
		tb := attnRows / p.hb
		grid := cudadrv.Dim3{X: uint32(cudadrv.Blocks(a.NTok, tb)), Y: uint32(a.NHeads / p.hb), Z: uint32(splits)}
		b := attnParams(a, p.hb, p.bk, p.tpr, chunk, splits, q8, q8ds)
		if err := k.ready(); err != nil {
			return err
		}
		if err := launch(k.attn[p.dpl], s, grid, cudadrv.D1(attnThreads), p.shared, func(args *cudadrv.Args) {
			args.Bytes(b[:])
		}); err != nil {
			return err
		}
	}
	if splits == 1 {
		return nil
	}
	rows := a.NTok * a.NHeads
	return launch(k.combine, s, cudadrv.D1(rows), cudadrv.D1(min(1024, (a.HeadSize+31)&^31)), 0, func(args *cudadrv.Args) {
		args.Ptr(a.Out).Ptr(a.Part).Ptr(a.ML).I32(int32(splits)).I32(int32(rows)).I32(int32(a.HeadSize)).Ptr(q8).Ptr(q8ds)
	})
}

// runMMA queues the tensor-core kernel: grid (token tiles of 64/hb tokens,
// head groups of hb), the same parameters as attn_f16 with one split.
func (k *Attention) runMMA(s *cudadrv.Stream, a *AttnArgs, p attnMMAPlan) error {
	q8, q8ds, err := attnQ8(a)
	if err != nil {
		return err
	}
	b := attnParams(a, p.hb, 0, 0, math.MaxInt32, 1, q8, q8ds)
	if err := k.ready(); err != nil {
		return err
	}
	tb := attnMMARows / p.hb
	grid := cudadrv.Dim3{X: uint32(cudadrv.Blocks(a.NTok, tb)), Y: uint32(a.NHeads / p.hb), Z: 1}
	return launch(k.mma[a.HeadSize], s, grid, cudadrv.D1(attnMMAThreads), p.shared, func(args *cudadrv.Args) {
		args.Bytes(b[:])
	})
}

// attnQ8 returns the Q8_1 output's values and block scales, if asked for.
func attnQ8(a *AttnArgs) (q8, q8ds cudadrv.DevicePtr, err error) {
	if a.Q8 == 0 {
		return 0, 0, nil
	}
	if a.HeadSize%32 != 0 {
		return 0, 0, fmt.Errorf("kernels: Q8_1 output of attention with heads of %d", a.HeadSize)
	}
	return a.Q8, a.Q8.Add(align16(a.NTok * a.NHeads * a.HeadSize)), nil
}

// attnParams lays out struct AttnParams of attention.cu: 7 pointers, a
// float, 9 ints and 2 more pointers (the 9th int ends where the 8-byte
// aligned pointers begin, at 96).
func attnParams(a *AttnArgs, hb, bk, tpr, chunk, splits int, q8, q8ds cudadrv.DevicePtr) [112]byte {
	var b [112]byte
	for i, ptr := range []cudadrv.DevicePtr{a.Out, a.Part, a.ML, a.Q, a.K, a.V, a.Pos0} {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(ptr))
	}
	binary.LittleEndian.PutUint32(b[56:], math.Float32bits(a.Scale))
	for i, v := range []int{a.NTok, a.NHeads, a.NKV, a.HeadSize, hb, bk, tpr, chunk, splits} {
		binary.LittleEndian.PutUint32(b[60+4*i:], uint32(int32(v)))
	}
	binary.LittleEndian.PutUint64(b[96:], uint64(q8))
	binary.LittleEndian.PutUint64(b[104:], uint64(q8ds))
	return b
}
