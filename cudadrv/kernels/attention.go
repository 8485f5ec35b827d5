// Attention over the KV cache on the GPU: the cache writes, decode and
// prefill attention, and the gather of a paged cache for prefill.
//
// # How the engine calls these kernels (the paged cache and the batch)
//
// A layer's cache is a KVCache: two arrays K and V of Rows cells, each cell
// one token's row of Width = NKV*HeadSize values in the cache's KVType
// (KVF16: 2 bytes a value; KVQ8_0 and KVQ4_0: ggml's Q8_0 and Q4_0 blocks,
// Width/32*34 and Width/32*18 bytes a row, bit-identical to llama.cpp's
// -ctk q8_0 and q4_0). Rows = NBlocks*Block;
// position p of a sequence is cell table[p/Block]*Block + p%Block of its
// block table.
//
// Per step (n query tokens of nSeq sequences), before the first layer, the
// engine uploads three int32 arrays to device memory, described by a Batch:
//
//	Pos[n]                 token t's position
//	Seq[n]                 token t's sequence, an index 0..nSeq-1 into Tables
//	Tables[nSeq*MaxBlocks] sequence s's block table at s*MaxBlocks
//
// (MaxBlocks = Rows/Block, the longest table; unused entries are never
// read). Every launcher reads them on the device, so a graph captured for
// a batch size replays at any positions and tables. Tokens of one sequence
// are contiguous in the step with consecutive positions (a prompt chunk),
// or one token (decode).
//
// Per layer, in this order:
//
//  1. Store the step's K and V rows: Rope.Run with RopeArgs.Batch set and
//     RopeKV.Cache set (the rotation fused with the write, f16 or
//     quantized; quantized needs HeadSize % 32 == 0), or Attention.StoreKV
//     after a separate rotation. Every token's row is written before any attention of the
//     layer reads the cache.
//  2. Attention, by rows of the step:
//     - decode rows (one token of a sequence in this step): DecodeKV over
//     all of them in one launch. They must be consecutive tokens of the
//     step, First..First+NTok-1 (put the decode tokens first, then the
//     prompt chunks), Q and Out pointing at their rows. Splits and Chunk
//     from DecodeSplits over the longest sequence the cache can hold
//     (Splits*Chunk must exceed every position, so a captured graph fits
//     any step); Part and ML sized by AttnScratch(NTok, NHeads, HeadSize,
//     Splits).
//     - each prompt chunk (tokens i..j of one sequence, positions
//     Pos[i]..Pos[j]): GatherKV with Tok = j copies positions 0..Pos[j] of
//     its sequence into contiguous f16 scratch [MaxLen][Width] (K and V),
//     then Run (AttnArgs) on that scratch with Pos0 = Pos + 4*i (the
//     device address of Pos[i]) and NTok = j-i+1: the tensor-core or
//     CUDA-core prefill kernels, unchanged. The gather can be skipped
//     when the type is f16 and the sequence's blocks are consecutive
//     cells from 0 (pass the cache itself, offset to its first cell).
//  3. The output head: Elementwise.GatherRows picks the rows whose logits
//     are wanted (an int32 index array on the device) before the final
//     norm and the output matmul.
//
// A quantized cache holds its keys and values rotated (ops.KVRotation: rk for
// keys and queries, rv for values): step 1 with RopeArgs.Rot = rk and
// RopeKV.RotV = rv (the launch must hold the queries too), decode with
// DecodeKVArgs.Rot = rv, which rotates the output rows back; prompt
// chunks' outputs take Elementwise.FWHT(rv) after Run. Without the fused
// store: Elementwise.FWHT of Q and K (rk) and V (rv) before StoreKV.
//
// Numerics: writes round to f16 to nearest, or quantize as ggml's
// quantize_row_q8_0_ref and quantize_row_q4_0_ref (the CPU's KVLayer.Store
// bits). Decode attention rounds Q to f16 over an f16 cache and reads q8_0
// values as f16(d*q), q4_0 values as f16(d*(q-8)).
// Over a q8_0 cache whose KV group has at most 8 query heads (on CC 8.0
// and later: DecodeKVInt8) it quantizes Q to Q8_0 per head as the CPU's
// q8_0 flash attention does, and takes each block's key products on the
// integer tensor cores, exact, scaled by the two blocks' scales; else Q
// is rounded to f16 and the keys read as f16(d*q). Scores accumulate in
// f32, and the unnormalised probabilities are rounded to f16 before P·V,
// as the prefill kernel does. TestKVBatch bounds the normalised squared
// error per token by 1e-6 against a float64 attention over the values the
// kernels read (q8_0: f16(d*q), which differs from d*q by at most 2^-11
// relative; the int8 path's Q8_0 query and d*q keys).
//
// The contiguous launchers (Store, Run's decode with AttnArgs, RopeArgs.Pos0)
// keep working on a contiguous cache at pos0 + t, for one sequence.

package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"os"
	"slices"

	"github.com/atsinfer/ats/cudadrv"
)

// Attention holds the kernels of attention.cu (KV-cache writes, flash
// attention over an f16 cache, the split-K combine) for one context.
type Attention struct {
	lazyModule
	store   *cudadrv.Function
	combine *cudadrv.Function
	plane2  *cudadrv.Function         // q8_1_plane2
	attn    map[int]*cudadrv.Function // by values per lane: ceil(headSize/32)
	mma     map[int]*cudadrv.Function // tensor-core prefill kernels by head size
	dec     map[int]*cudadrv.Function // decode kernels by head size
	// decKV are the paged decode kernels by cache type and head size;
	// storeQ (by type: the quantized ones) and gather the paged cache
	// writes and the prefill gathers.
	decKV [kvTypes]map[int]*cudadrv.Function
	// decI8 are the q8_0 cache's int8 decode kernels by head size
	// (attn_dec_q8_0i_d<hs>), and int8 whether they run (DecodeKVInt8).
	decI8 map[int]*cudadrv.Function
	int8  bool
	// dec1 are the CUDA-core paged f16 decode kernels for a lone row, by
	// head size.
	dec1   map[int]*cudadrv.Function
	storeQ [kvTypes]*cudadrv.Function
	gather [kvTypes]*cudadrv.Function
	// optin is the shared memory a block of the attention kernels may use
	// (the device's opt-in limit, granted at load): decode takes larger
	// tiles with it.
	optin int
	// simt forces the CUDA-core kernel for every prefill launch, tiled
	// attn_f16 for decode, mma the tensor-core paged decode for a lone row
	// too (EnvAttention).
	simt, tiled, mma1 bool
	// forceDecKV, when its warps are set, is the paged decode kernel's
	// warps and buffers instead of planDecodeKV's choice, where they fit:
	// for the benchmarks' sweeps of the shape.
	forceDecKV struct{ warps, stages int }
}

// EnvAttention set to "simt" makes every prefill launch use the CUDA-core
// kernel (attn_f16), also where the tensor-core one would run; "tile" makes
// decode use attn_f16 instead of attn_dec; "mma" makes a lone decode row
// over an f16 cache take the tensor-core kernel (attn_dec_f16_d*) instead
// of attn_dec1_f16_e*; "q8f16" makes decode over a q8_0 cache read its
// keys as f16 (attn_dec_q8_0_d*) where the int8 kernel would run: for A/B
// measurements of each.
const EnvAttention = "ATS_GPU_ATTN"

// NewAttention prepares attention.cu's kernels for the context's device;
// the module loads at the first launch.
func NewAttention(ctx *cudadrv.Context) (*Attention, error) {
	optin, err := ctx.Device().Attribute(cudadrv.AttrMaxSharedMemoryPerBlockOptin)
	if err != nil {
		return nil, err
	}
	major, _, err := ctx.Device().ComputeCapability()
	if err != nil {
		return nil, err
	}
	env := os.Getenv(EnvAttention)
	k := &Attention{attn: map[int]*cudadrv.Function{}, mma: map[int]*cudadrv.Function{}, dec: map[int]*cudadrv.Function{},
		decKV: [kvTypes]map[int]*cudadrv.Function{{}, {}, {}}, dec1: map[int]*cudadrv.Function{}, decI8: map[int]*cudadrv.Function{},
		optin: max(attnShared, optin), simt: env == "simt", tiled: env == "tile", mma1: env == "mma",
		int8: major >= 8 && env != "q8f16"}
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
	if err := lookup(m, map[string]**cudadrv.Function{"kv_store_f16": &k.store, "kv_store_q8_0": &k.storeQ[KVQ8_0],
		"kv_store_q4_0": &k.storeQ[KVQ4_0], "kv_gather_f16": &k.gather[KVF16], "kv_gather_q8_0": &k.gather[KVQ8_0],
		"kv_gather_q4_0": &k.gather[KVQ4_0], "attn_combine": &k.combine, "q8_1_plane2": &k.plane2}); err != nil {
		return err
	}
	// The kernels of one family, by a size: each looked up, and granted
	// the opt-in shared memory when optin.
	family := func(dst map[int]*cudadrv.Function, sizes []int, optin bool, name func(int) string) error {
		for _, n := range sizes {
			f, err := m.Function(name(n))
			if err == nil && optin && k.optin > attnShared {
				err = f.SetAttribute(cudadrv.FuncMaxDynamicSharedSizeBytes, k.optin)
			}
			if err != nil {
				return err
			}
			dst[n] = f
		}
		return nil
	}
	for t := KVType(0); t < kvTypes; t++ {
		if err := family(k.decKV[t], attnDecHeadSizes, true, func(hs int) string { return fmt.Sprintf("attn_dec_%s_d%d", t, hs) }); err != nil {
			return err
		}
	}
	// The other families, each by its size, all granted it too.
	for _, f := range []struct {
		dst   map[int]*cudadrv.Function
		sizes []int
		name  string // with the size
	}{
		{k.decI8, decI8HeadSizes, "attn_dec_q8_0i_d%d"},
		{k.attn, attnDPL, "attn_f16_d%d"},
		{k.mma, attnMMAHeadSizes, "attn_mma_d%d"},
	} {
		if err := family(f.dst, f.sizes, true, func(n int) string { return fmt.Sprintf(f.name, n) }); err != nil {
			return err
		}
	}
	// attn_dec1_f16_e<E> and attn_dec_e<E> go by values a lane (head size / 32).
	for _, f := range []struct {
		dst  map[int]*cudadrv.Function
		name string
	}{{k.dec1, "attn_dec1_f16_e%d"}, {k.dec, "attn_dec_e%d"}} {
		if err := family(f.dst, attnDecHeadSizes, false, func(hs int) string { return fmt.Sprintf(f.name, hs/32) }); err != nil {
			return err
		}
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
		a.Ptr(kc).Ptr(vc).Ptr(kSrc).Ptr(vSrc).I32(int32(width)).
			Ptr(pos0).I32(0).Ptr(0).Ptr(0).I32(0).I32(0).I32(int32(nTok))
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
	// (Q8_1PlanesBytes(Q8Planes, NTok, NHeads*HeadSize); HeadSize % 32 ==
	// 0): the input of the output projection, without a launch of its own
	// (two planes take one more launch: q8_1_plane2).
	Q8       cudadrv.DevicePtr
	Q8Planes int
}

// AttnScratch is the bytes of Part and ML for a launch of nTok rows and
// the given splits.
func AttnScratch(nTok, nHeads, headSize, splits int) (part, ml int) {
	rows := splits * nTok * nHeads
	return 4 * rows * headSize, 8 * rows
}

// DecodeSplits chooses the split-K layout for decoding over a cache of ctx
// positions with blocks of the given warps (DecodeWarps): about 8 warps
// per multiprocessor when the cache is full (two blocks of 4, one of 8;
// one block of more), chunks of at least 64 positions. Short contexts
// leave the later splits empty; they exit at once.
func DecodeSplits(ctx, nKV, warps, multiprocessors int) (splits, chunk int) {
	want := max(1, max(1, 8/max(1, warps))*multiprocessors/max(1, nKV))
	chunk = max(64, (ctx+want-1)/want)
	chunk = (chunk + 63) &^ 63
	return (ctx + chunk - 1) / chunk, chunk
}

// DecodeWarps is the warps of a block of the paged decode kernel for head
// size hs, nHeads query heads over nKV KV heads and cache type t (4 where
// planDecodeKV fails: the launch then reports the error).
func (k *Attention) DecodeWarps(hs, nHeads, nKV int, t KVType) int {
	if p, err := planDecodeKV(hs, t, k.DecodeKVInt8(hs, nHeads, nKV, t), k.optin); err == nil {
		return p.warps
	}
	return 4
}

// decI8HeadSizes are the head sizes of the int8 decode kernels.
var decI8HeadSizes = []int{64, 128, 256}

// DecodeKVInt8 says whether decode over a cache of type t with heads of
// hs, nHeads query heads over nKV KV heads, takes the int8 kernel
// (attn_dec_q8_0i_d<hs>): a q8_0 cache whose rows are a multiple of 16
// bytes (the kernel copies them 16 bytes at a time: an even number of KV
// heads of 128, a multiple of 4 of 64, any of 256), a group of at most 8
// heads (the integer products' 8 columns), heads of 64 to 256, CC 8.0 and
// later (m16n8k32 integer products), not disabled by EnvAttention. It
// quantizes the queries to Q8_0 (see the numerics above). Other q8_0
// caches take the kernel that reads the keys as f16.
func (k *Attention) DecodeKVInt8(hs, nHeads, nKV int, t KVType) bool {
	if !k.int8 || t != KVQ8_0 || nKV <= 0 || nHeads%nKV != 0 || !slices.Contains(decI8HeadSizes, hs) {
		return false
	}
	group := nHeads / nKV
	return group >= 1 && group <= 8 && t.RowBytes(nKV*hs)%16 == 0
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
	if err := k.run(s, a); err != nil || a.Q8 == 0 || a.Q8Planes < 2 {
		return err
	}
	// The second Q8_1 plane, from Out (these kernels write the first).
	n := a.NTok * a.NHeads * a.HeadSize
	ds, plane, err := q8Planes(a.Q8, a.Q8Planes, a.NTok, a.NHeads*a.HeadSize)
	if err != nil {
		return err
	}
	return launch(k.plane2, s, grid1(cudadrv.Blocks(n/32, 8), 1), cudadrv.D1(256), 0, func(args *cudadrv.Args) {
		args.Ptr(a.Out).I64(int64(n)).Ptr(a.Q8).Ptr(ds).I64(plane)
	})
}

// run is Run less the second Q8_1 plane.
func (k *Attention) run(s *cudadrv.Stream, a *AttnArgs) error {
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
	ds, _, err := q8Planes(a.Q8, a.Q8Planes, a.NTok, a.NHeads*a.HeadSize)
	return a.Q8, ds, err
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

// ---- the paged cache (see the top of this file)

// KVType is the type of a KV cache's cells.
type KVType uint8

const (
	KVF16  KVType = iota // binary16, 2 bytes a value
	KVQ8_0               // ggml's Q8_0: {f16 d; int8 q[32]} per 32 values, 34 bytes
	KVQ4_0               // ggml's Q4_0: {f16 d; 16 bytes of nibbles} per 32 values, 18 bytes

	kvTypes = 3
)

func (t KVType) String() string {
	switch t {
	case KVF16:
		return "f16"
	case KVQ8_0:
		return "q8_0"
	case KVQ4_0:
		return "q4_0"
	}
	return fmt.Sprintf("KVType(%d)", uint8(t))
}

// Quantized says whether the type stores blocks of 32 values.
func (t KVType) Quantized() bool { return t == KVQ8_0 || t == KVQ4_0 }

// RowBytes is the bytes of a cache row of width values.
func (t KVType) RowBytes(width int) int {
	switch t {
	case KVQ8_0:
		return width / 32 * 34
	case KVQ4_0:
		return width / 32 * 18
	}
	return 2 * width
}

// KVCache is one layer's cache: K and V, each [rows][Type.RowBytes(Width)]
// bytes, 16-byte aligned.
type KVCache struct {
	K, V  cudadrv.DevicePtr
	Type  KVType
	Width int // values a row: NKV*HeadSize
}

func (c *KVCache) check() error {
	switch {
	case c.Type >= kvTypes:
		return fmt.Errorf("kernels: KV cache of type %v", c.Type)
	case c.Width <= 0 || (c.Type.Quantized() && c.Width%32 != 0):
		return fmt.Errorf("kernels: %v KV cache rows of %d values (%v needs a multiple of 32)", c.Type, c.Width, c.Type)
	case c.K == 0 || c.V == 0 || c.K%16 != 0 || c.V%16 != 0:
		return fmt.Errorf("kernels: %v KV cache at %#x, %#x: two 16-byte aligned arrays needed", c.Type, c.K, c.V)
	}
	return nil
}

// Batch is one step's tokens on the device: int32 arrays Pos[n] and Seq[n]
// (token t's position and sequence) and Tables[nSeq*MaxBlocks] (sequence
// s's block ids at s*MaxBlocks). Block is the positions of a cache block.
type Batch struct {
	Pos, Seq, Tables cudadrv.DevicePtr
	MaxBlocks        int
	Block            int // a power of two, at least 64
}

// shift checks b and returns log2 of its block size.
func (b *Batch) shift() (int, error) {
	if b == nil {
		return 0, fmt.Errorf("kernels: no batch")
	}
	if b.Pos == 0 || b.Seq == 0 || b.Tables == 0 || b.Pos%4 != 0 || b.Seq%4 != 0 || b.Tables%4 != 0 {
		return 0, fmt.Errorf("kernels: batch arrays pos %#x, seq %#x, tables %#x: three aligned int32 arrays needed", b.Pos, b.Seq, b.Tables)
	}
	if b.Block < 64 || b.Block&(b.Block-1) != 0 || b.Block > 1<<30 {
		return 0, fmt.Errorf("kernels: KV block of %d positions: a power of two from 64 needed", b.Block)
	}
	if b.MaxBlocks <= 0 {
		return 0, fmt.Errorf("kernels: block tables of %d blocks", b.MaxBlocks)
	}
	return bits.TrailingZeros(uint(b.Block)), nil
}

// StoreKVArgs describe a cache write: K and V rows ([NTok][Cache.Width]
// float) of the batch's tokens First..First+NTok-1 into their cells.
type StoreKVArgs struct {
	Cache KVCache
	Batch *Batch
	First int
	K, V  cudadrv.DevicePtr
	NTok  int
}

// StoreKV queues the write of a.NTok tokens' keys and values into their
// cache cells (Q8_0 and Q4_0 quantized as ggml's quantize_row_q8_0_ref and
// quantize_row_q4_0_ref, f16 rounded to nearest).
func (k *Attention) StoreKV(s *cudadrv.Stream, a *StoreKVArgs) error {
	if a.NTok == 0 {
		return nil
	}
	shift, err := a.Batch.shift()
	if err == nil {
		err = a.Cache.check()
	}
	if err == nil && (a.NTok < 0 || a.First < 0) {
		err = fmt.Errorf("kernels: store of tokens %d..%d+%d", a.First, a.First, a.NTok)
	}
	if err != nil {
		return fmt.Errorf("StoreKV: %w", err)
	}
	if err := k.ready(); err != nil {
		return err
	}
	// f16: a thread a value; quantized: a warp a block of 32 values, as many threads.
	f := k.store
	if a.Cache.Type.Quantized() {
		f = k.storeQ[a.Cache.Type]
	}
	grid := grid1(a.NTok*a.Cache.Width, 256)
	b := a.Batch
	return launch(f, s, grid, cudadrv.D1(256), 0, func(p *cudadrv.Args) {
		p.Ptr(a.Cache.K).Ptr(a.Cache.V).Ptr(a.K).Ptr(a.V).I32(int32(a.Cache.Width)).
			Ptr(b.Pos.Add(4 * a.First)).I32(1).Ptr(b.Seq.Add(4 * a.First)).Ptr(b.Tables).
			I32(int32(b.MaxBlocks)).I32(int32(shift)).I32(int32(a.NTok))
	})
}

// DecodeKVArgs describe a decode launch over the paged cache: NTok query
// rows, the batch's tokens First..First+NTok-1, each attending to positions
// 0..Pos[t] of its sequence Seq[t].
type DecodeKVArgs struct {
	Out, Q cudadrv.DevicePtr // [NTok][NHeads*HeadSize] float, Q 16-byte aligned
	Cache  KVCache
	Batch  *Batch
	First  int

	NTok, NHeads, NKV, HeadSize int // HeadSize 32, 64, 128 or 256
	Scale                       float32

	// Splits > 1 divides each row's positions among the splits, a block
	// column each, merged by the last of them to finish; Part and ML are
	// their scratch (AttnScratch), Count their arrival counters
	// (DecodeCounters bytes, zero before the first launch: each launch
	// leaves them zero). A row of n positions takes chunks of
	// max(64, n/Splits rounded up to 64), at most Chunk (a multiple of 64):
	// Splits*Chunk must exceed every position a token of the batch can
	// have, and a short row walks no more positions a block than it must.
	Splits, Chunk   int
	Part, ML, Count cudadrv.DevicePtr

	// Q8, when set, also receives Out in the Q8_1 layout of QuantizeQ8_1
	// (Q8_1PlanesBytes(Q8Planes, NTok, NHeads*HeadSize)), as AttnArgs.Q8,
	// both planes in the decode kernels' own epilogues.
	Q8       cudadrv.DevicePtr
	Q8Planes int

	// Rot > 0 rotates each head of the output back, in chunks of Rot
	// values, before Out and Q8 are written (ops.FWHT, bit for bit on the
	// merged rows): a cache that holds its values rotated (a q8_0 cache's
	// ops.KVRotation) yields rotated outputs. A power of two from 32 to 256
	// that divides HeadSize; it takes attn_dec_<type>_d<hs> for every row
	// count (attn_dec1 does not rotate).
	Rot int

	// Short says every row attends to fewer than DecodeShortRow
	// positions: a lone row over an f16 cache then takes attn_dec1 (a
	// block a head on the CUDA cores), else the tensor-core kernel. A
	// speed hint only: both kernels take any row (a captured graph that
	// replays at later positions keeps its choice).
	Short bool
}

// DecodeShortRow is the row length below which a lone f16 decode row runs
// on attn_dec1. H200, Qwen3-14B's heads (BenchmarkKVDecode): attn_dec1 took
// 4.7 µs a layer at 22 positions where the tensor-core kernel took 8.9, but
// 72 µs at 16384 where the other took 41: a block a query head reads each
// cached row once a head of its group.
const DecodeShortRow = 256

// The paged decode kernels' shape (attention.cu, attn_dec_<type>_d<hs>):
// positions a run (a warp's step), query rows of the tensor-core tile.
const (
	decKVRun  = 16
	decKVRows = 16
)

// decKVPlan is the launch shape of a paged decode kernel: warps a block,
// cp.async buffers a warp, shared bytes a warp and in all, and whether it
// is the int8 kernel.
type decKVPlan struct {
	warps, stages, region, shared int
	int8                          bool
}

// planDecodeKV picks the warps and buffers of the paged decode kernel for
// head size hs and cache type t within optin bytes of shared memory a
// block: the first of 8 warps with 2 buffers, 4 warps with 3, then 2, 2
// warps with 2, and fewer, that fits (H200, head size 128: 8 warps, 2
// buffers, 140 KiB for f16 and 142 KiB for q8_0, one block a
// multiprocessor: a block of 8 warps halves the splits of a long row, and
// their merge, against two blocks of 4; BenchmarkKVDecodeShape). The
// sizes are attention.cu's: Q [16][hs+8] f16, then a region a warp of the
// buffers (K and V runs of 16 rows of 2*(hs+8) bytes for f16; for q8_0, of
// the row's bytes rounded up to an odd number of 4-byte words), for q8_0
// also the dequantized K and V tiles ([16][hs+8] f16 each), and at least
// the merge's O [16][hs+8] float with 32 floats of maxima and sums.
//
// The int8 kernel (int8) stages its q8_0 rows as it copies them, 16 bytes
// at a time from a 16-byte boundary (int8Row), and keeps one tile, V's;
// its registers fit 12 warps a block, tried first (H200, head size 128:
// 163 KiB). Three warps a scheduler hide more of each
// other's waits, and a split's runs spread more evenly: at depth 16384
// in a cache of 16448 positions a split holds 68 runs, 9 for some of 8
// warps but 6 for each of 12. BenchmarkKVDecodeShape at depth 16384 on
// the H200, while the kernel copied 8 bytes at a time: 26.7 µs a layer
// against 33.5 in blocks of 8, which at 126 registers and 109 KiB fit
// two a multiprocessor, so that the block scheduler paired them and left
// others idle; more was slower or no faster: 12 warps of 3 buffers (208
// KiB) 30.7 µs against 25.9, 16 warps of 2 (208 KiB) 30.9, 13 and 14
// warps 26.0 and 25.8 (copies under 16 bytes pass through L1, which that
// much shared memory leaves small). With copies of 16 bytes (136
// registers) 12 warps take 24.5 µs with 2 buffers, 25.1 with 3.
func planDecodeKV(hs int, t KVType, int8 bool, optin int) (decKVPlan, error) {
	shapes := []struct{ warps, stages int }{{8, 2}, {4, 3}, {4, 2}, {2, 2}, {4, 1}, {2, 1}, {1, 1}}
	if int8 && t == KVQ8_0 {
		shapes = append([]struct{ warps, stages int }{{decKVMaxWarpsInt8, 2}}, shapes...)
	}
	for _, c := range shapes {
		if p := sizeDecodeKV(hs, t, int8, c.warps, c.stages); p.shared <= optin {
			return p, nil
		}
	}
	return decKVPlan{}, fmt.Errorf("kernels: %v decode attention of head size %d needs more shared memory than %d bytes", t, hs, optin)
}

// decKVMaxWarps is attention.cu's DK_MAX_WARPS: the launch bound of the
// paged decode kernels. Blocks of 12 warps (three a scheduler) were tried
// on the H200 for the f16 keys of a q8_0 cache: with registers capped to
// fit them, q8_0 at depth 16384 took 33.1 µs a layer where 8 warps take
// 29.9.
const decKVMaxWarps = 8

// decKVMaxWarpsInt8 is attention.cu's DK_I8_MAX_WARPS, the int8 kernel's
// launch bound.
const decKVMaxWarpsInt8 = 12

// int8Row is the bytes the int8 kernel stages of a head's row (its WSEG):
// 16-byte copies from the 16-byte boundary at or before the row.
func int8Row(hs int) int {
	seg := hs / 32 * 34
	align := 4
	switch {
	case seg%16 == 0:
		align = 16
	case seg%8 == 0:
		align = 8
	}
	return (seg + 16 - align + 15) / 16 * 16
}

// sizeDecodeKV lays out the shared memory of the paged decode kernel with
// the given warps and buffers a warp.
func sizeDecodeKV(hs int, t KVType, int8 bool, warps, stages int) decKVPlan {
	ld := hs + 8
	row, tiles := 2*ld, 0
	if t.Quantized() {
		words := (t.RowBytes(hs) + 3) / 4
		row, tiles = 4*(words|1), 2*decKVRun*ld*2
		if int8 {
			row, tiles = int8Row(hs), decKVRun*ld*2
		}
	}
	stage := 2 * decKVRun * row
	merge := decKVRows*ld*4 + 2*decKVRows*4
	region := align16(max(stages*stage+tiles, merge))
	return decKVPlan{warps, stages, region, decKVRows*ld*2 + warps*region, int8 && t == KVQ8_0}
}

// DecodeCounters is the bytes of DecodeKVArgs.Count for nTok rows of
// nHeads query heads: a counter a block column (a token's KV group, 16
// heads at most), at most one a head.
func DecodeCounters(nTok, nHeads int) int { return 4 * nTok * nHeads }

// DecodeKV queues the attention of a.NTok decode rows over the paged cache
// (attn_dec_<type>_d<hs>, or attn_dec1_f16_e<hs/32> for a lone row over
// an f16 cache; one launch: split rows merge inside it).
func (k *Attention) DecodeKV(s *cudadrv.Stream, a *DecodeKVArgs) error {
	if a.NTok == 0 {
		return nil
	}
	shift, plan, err := k.checkDecodeKV(a)
	if err != nil {
		return fmt.Errorf("DecodeKV: %w", err)
	}
	splits, chunk := a.Splits, a.Chunk
	if splits <= 1 {
		splits, chunk = 1, math.MaxInt32&^63
	}
	var q8, q8ds cudadrv.DevicePtr
	var plane int64
	if a.Q8 != 0 {
		if q8ds, plane, err = q8Planes(a.Q8, a.Q8Planes, a.NTok, a.NHeads*a.HeadSize); err != nil {
			return fmt.Errorf("DecodeKV: %w", err)
		}
		q8 = a.Q8
	}
	b := decKVParams(a, shift, chunk, splits, plan, q8, q8ds, plane)
	if err := k.ready(); err != nil {
		return err
	}
	if a.NTok == 1 && a.Short && a.Cache.Type == KVF16 && !k.mma1 && a.Rot == 0 {
		// A lone row: a block a head on the CUDA cores (attn_dec1).
		grid := cudadrv.Dim3{X: 1, Y: uint32(a.NHeads), Z: uint32(splits)}
		return launch(k.dec1[a.HeadSize], s, grid, cudadrv.D1(attnDecThreads), 0, func(args *cudadrv.Args) {
			args.Bytes(b[:])
		})
	}
	group := a.NHeads / a.NKV
	f := k.decKV[a.Cache.Type][a.HeadSize]
	if plan.int8 {
		f = k.decI8[a.HeadSize] // a block a KV group
	}
	grid := cudadrv.Dim3{X: uint32(a.NTok), Y: uint32(a.NKV * cudadrv.Blocks(group, decKVRows)), Z: uint32(splits)}
	return launch(f, s, grid, cudadrv.D1(32*plan.warps), plan.shared, func(args *cudadrv.Args) {
		args.Bytes(b[:])
	})
}

// checkDecodeKV validates a and returns the batch's block shift and the
// kernel's plan.
func (k *Attention) checkDecodeKV(a *DecodeKVArgs) (int, decKVPlan, error) {
	shift, err := a.Batch.shift()
	if err != nil {
		return 0, decKVPlan{}, err
	}
	if err := a.Cache.check(); err != nil {
		return 0, decKVPlan{}, err
	}
	switch {
	case a.HeadSize != 32 && a.HeadSize != 64 && a.HeadSize != 128 && a.HeadSize != 256:
		return 0, decKVPlan{}, fmt.Errorf("kernels: decode attention of head size %d (32, 64, 128 or 256)", a.HeadSize)
	case a.NKV <= 0 || a.NHeads <= 0 || a.NHeads%a.NKV != 0:
		return 0, decKVPlan{}, fmt.Errorf("kernels: decode attention of %d heads over %d KV heads", a.NHeads, a.NKV)
	case a.Cache.Width != a.NKV*a.HeadSize:
		return 0, decKVPlan{}, fmt.Errorf("kernels: KV cache rows of %d values for %d KV heads of %d", a.Cache.Width, a.NKV, a.HeadSize)
	case a.NTok < 0 || a.First < 0:
		return 0, decKVPlan{}, fmt.Errorf("kernels: decode of tokens %d..%d+%d", a.First, a.First, a.NTok)
	case a.Q == 0 || a.Out == 0 || a.Q%16 != 0 || a.Out%4 != 0:
		return 0, decKVPlan{}, fmt.Errorf("kernels: decode attention's Q %#x (16-byte aligned) and Out %#x", a.Q, a.Out)
	case a.Splits > 1 && (a.Chunk <= 0 || a.Chunk%64 != 0 || a.Part == 0 || a.ML == 0 || a.Count == 0):
		return 0, decKVPlan{}, fmt.Errorf("kernels: split decode attention needs a chunk that is a multiple of 64 (not %d), scratch and counters", a.Chunk)
	case a.Splits > 65535 || a.NKV*cudadrv.Blocks(a.NHeads/a.NKV, decKVRows) > 65535:
		return 0, decKVPlan{}, fmt.Errorf("kernels: decode attention of %d splits over %d KV heads: grid too large", a.Splits, a.NKV)
	}
	if err := checkRot("decode attention's output", a.Rot, a.HeadSize); err != nil {
		return 0, decKVPlan{}, err
	}
	int8 := k.DecodeKVInt8(a.HeadSize, a.NHeads, a.NKV, a.Cache.Type)
	if f := k.forceDecKV; f.warps > 0 {
		// A benchmark's imposed shape (see forceDecKV).
		if p := sizeDecodeKV(a.HeadSize, a.Cache.Type, int8, f.warps, f.stages); p.shared <= k.optin && (f.warps <= decKVMaxWarps || int8 && f.warps <= decKVMaxWarpsInt8) {
			return shift, p, nil
		}
	}
	plan, err := planDecodeKV(a.HeadSize, a.Cache.Type, int8, k.optin)
	return shift, plan, err
}

// decKVParams lays out struct DecKVParams of attention.cu: 12 pointers, a
// float, 11 ints and the Q8_1 second plane's offset (152 bytes, a multiple
// of the struct's 8-byte alignment).
func decKVParams(a *DecodeKVArgs, shift, chunk, splits int, plan decKVPlan, q8, q8ds cudadrv.DevicePtr, q8plane int64) [152]byte {
	var b [152]byte
	bt := a.Batch
	for i, ptr := range []cudadrv.DevicePtr{a.Out, a.Part, a.ML, a.Q, a.Cache.K, a.Cache.V,
		bt.Pos.Add(4 * a.First), bt.Seq.Add(4 * a.First), bt.Tables, q8, q8ds, a.Count} {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(ptr))
	}
	binary.LittleEndian.PutUint32(b[96:], math.Float32bits(a.Scale))
	for i, v := range []int{a.NTok, a.NHeads, a.NKV, bt.MaxBlocks, shift, chunk, splits,
		a.Cache.Type.RowBytes(a.Cache.Width), plan.stages, plan.region, a.Rot} {
		binary.LittleEndian.PutUint32(b[100+4*i:], uint32(int32(v)))
	}
	binary.LittleEndian.PutUint64(b[144:], uint64(q8plane))
	return b
}

// GatherKVArgs describe the gather of a sequence's cache for prefill:
// positions 0..Pos[Tok] of sequence Seq[Tok] (Tok: the last token of the
// prompt chunk, an index into the batch), at most MaxLen, into contiguous
// f16 rows K and V ([MaxLen][Cache.Width] each, 16-byte aligned).
type GatherKVArgs struct {
	Cache  KVCache
	Batch  *Batch
	Tok    int
	MaxLen int
	K, V   cudadrv.DevicePtr
}

// GatherKV queues the gather (kv_gather_f16, or kv_gather_q8_0 and
// kv_gather_q4_0 dequantizing to f16(d*q) and f16(d*(q-8))). Positions
// past MaxLen are not copied: MaxLen is what the scratch holds.
func (k *Attention) GatherKV(s *cudadrv.Stream, a *GatherKVArgs) error {
	shift, err := a.Batch.shift()
	if err == nil {
		err = a.Cache.check()
	}
	if err == nil && (a.Tok < 0 || a.MaxLen <= 0 || a.K == 0 || a.V == 0 || a.K%16 != 0 || a.V%16 != 0) {
		err = fmt.Errorf("kernels: gather of token %d's sequence into %d rows at %#x, %#x (16-byte aligned)", a.Tok, a.MaxLen, a.K, a.V)
	}
	if err != nil {
		return fmt.Errorf("GatherKV: %w", err)
	}
	if err := k.ready(); err != nil {
		return err
	}
	per := a.Cache.Width // a thread a value, or 8 values a thread when rows are whole 16-byte pieces
	if a.Cache.Type.Quantized() || a.Cache.Width%8 == 0 {
		per = a.Cache.Width / 8
	}
	b := a.Batch
	return launch(k.gather[a.Cache.Type], s, grid1(a.MaxLen*per, 256), cudadrv.D1(256), 0, func(p *cudadrv.Args) {
		p.Ptr(a.K).Ptr(a.V).Ptr(a.Cache.K).Ptr(a.Cache.V).I32(int32(a.Cache.Width)).
			Ptr(b.Pos).Ptr(b.Seq).I32(int32(a.Tok)).Ptr(b.Tables).I32(int32(b.MaxBlocks)).I32(int32(shift)).I32(int32(a.MaxLen))
	})
}
