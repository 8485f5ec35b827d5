package kernels

import (
	"fmt"
	"math"

	"github.com/atsinfer/ats/cudadrv"
)

// Rope holds the kernel of rope.cu (rotary embedding with an optional
// per-head RMSNorm before it) for one context.
type Rope struct {
	lazyModule
	rope *cudadrv.Function
}

// NewRope prepares rope.cu's kernels for the context's device; the module
// loads at the first launch.
func NewRope(ctx *cudadrv.Context) (*Rope, error) {
	k := &Rope{}
	err := k.prepareLookup(ctx, "rope", map[string]**cudadrv.Function{
		"rope_norm_f32": &k.rope,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadRope is NewRope with the module loaded now.
func LoadRope(ctx *cudadrv.Context) (*Rope, error) { return loadNow(NewRope(ctx)) }

// RopeTensor is one tensor a rope launch rotates in place: NTok rows of
// Heads heads of the launch's HeadSize floats, each head normalised with
// NormW (HeadSize floats) first when NormW is not 0.
type RopeTensor struct {
	X     cudadrv.DevicePtr
	Heads int
	NormW cudadrv.DevicePtr
}

// RopeArgs describe a rope launch over one or two tensors (Q and K).
type RopeArgs struct {
	T        [2]RopeTensor
	NTensors int // 1 or 2

	HeadSize int
	Dims     int  // rotated values per head (n_rot), even; 0: the head norm only
	NeoX     bool // pairs (i, i+Dims/2) instead of (2i, 2i+1)
	Base     float32
	// FreqScale multiplies each angle (1/linear scaling factor; 0 means 1).
	FreqScale float32
	Factors   cudadrv.DevicePtr // Dims/2 divisors of the angles, or 0
	Eps       float32           // of the head norm

	// The tokens' positions: Pos0, a device int32 holding token 0's (token
	// t at Pos0 + t: one sequence), or Batch, the step's per-token
	// positions (Batch.Pos[First+t]) and, for a cache write, sequences and
	// block tables. One of the two.
	Pos0  cudadrv.DevicePtr
	Batch *Batch
	First int // with Batch: the launch's token 0 in the batch
	NTok  int

	// Rot > 0 also rotates every head of every tensor, after RoPE, by the
	// orthonormal Walsh-Hadamard transform of each chunk of Rot values, in
	// place (ops.FWHT, bit for bit): a q8_0 cache's rotation of the queries
	// and keys (ops.KVRotation), Elementwise.FWHT fused in. A power of two
	// from 32 to 256 that divides HeadSize.
	Rot int

	// KV, when set, also writes the rotated keys (tensor KV.T) and the
	// values KV.V to the cache (Attention.Store or StoreKV fused in).
	KV *RopeKV
}

// RopeKV says where a rope launch stores the keys it rotated: tensor T of
// the launch is the keys; V holds the values ([NTok][heads*HeadSize]
// float). With Pos0 they go to the contiguous f16 caches KC and VC
// ([ctx][heads*HeadSize], row = position); with Batch to Cache, each
// token's row to its cell through the batch's tables (f16, or q8_0 when
// HeadSize % 32 == 0).
//
// RotV > 0 stores the values rotated as RopeArgs.Rot rotates the heads, in
// chunks of RotV (V itself is left as it is): a q8_0 cache's rotation of
// the values. The same bounds as Rot.
type RopeKV struct {
	T      int
	V      cudadrv.DevicePtr
	KC, VC cudadrv.DevicePtr
	Cache  *KVCache
	RotV   int
}

// RotMax is the largest rotation chunk the rope and decode kernels fold
// in (RopeArgs.Rot, RopeKV.RotV, DecodeKVArgs.Rot): a warp's registers
// hold a chunk, 8 values a lane. Elementwise.FWHT takes up to 1024.
const RotMax = 256

// checkRot checks a rotation of chunks of n values of heads of hs: 0, or
// a power of two from 32 to RotMax that divides hs.
func checkRot(what string, n, hs int) error {
	if n == 0 {
		return nil
	}
	if n < 32 || n > RotMax || n&(n-1) != 0 || hs%n != 0 {
		return fmt.Errorf("kernels: %s rotation of chunks of %d values of heads of %d: a power of two from 32 to %d that divides the head", what, n, hs, RotMax)
	}
	return nil
}

// ThetaScale is base^(-2/dims) rounded to float32, as ops.Rope.Table
// computes it: the factor between consecutive pairs' angles.
func ThetaScale(base float32, dims int) float32 {
	return float32(math.Pow(float64(base), -2.0/float64(dims)))
}

const ropeWarps = 4

// Run queues the rotation (and head norms) of every head of every token.
func (k *Rope) Run(s *cudadrv.Stream, a *RopeArgs) error {
	if a.NTensors < 1 || a.NTensors > 2 || a.Dims < 0 || a.Dims%2 != 0 || a.Dims > a.HeadSize || a.Dims/2 > 256 {
		return fmt.Errorf("kernels: rope of %d dims of heads of %d over %d tensors", a.Dims, a.HeadSize, a.NTensors)
	}
	if err := checkRot("rope's", a.Rot, a.HeadSize); err != nil {
		return err
	}
	rotV := 0
	if a.KV != nil {
		if err := checkRot("rope's value", a.KV.RotV, a.HeadSize); err != nil {
			return err
		}
		rotV = a.KV.RotV
	}
	if a.NTok == 0 {
		return nil
	}
	heads := a.T[0].Heads
	if a.NTensors == 2 {
		heads = max(heads, a.T[1].Heads)
	}
	// Decode: spread the heads over many blocks. Prefill: one block per
	// token and tensor computes the angle table once for all its heads.
	hpb := heads
	if a.NTok < 32 {
		hpb = ropeWarps
	}
	// Values rotated on their way into the cache take a row of blocks of
	// their own (rope.cu).
	rows := a.NTensors
	if rotV > 0 {
		rows++
	}
	grid := cudadrv.Dim3{X: uint32(a.NTok), Y: uint32(rows), Z: uint32(cudadrv.Blocks(heads, hpb))}
	fs := a.FreqScale
	if fs == 0 {
		fs = 1
	}
	ts := float32(1)
	if a.Dims > 0 {
		ts = ThetaScale(a.Base, a.Dims)
	}
	neox := int32(0)
	if a.NeoX {
		neox = 1
	}
	t1 := a.T[1]
	if a.NTensors == 1 {
		t1 = RopeTensor{}
	}
	loc, err := a.locate()
	if err != nil {
		return err
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.rope, s, grid, cudadrv.D1(32*ropeWarps), 0, func(p *cudadrv.Args) {
		p.Ptr(a.T[0].X).I32(int32(a.T[0].Heads)).Ptr(a.T[0].NormW).
			Ptr(t1.X).I32(int32(t1.Heads)).Ptr(t1.NormW).
			I32(int32(a.HeadSize)).I32(int32(a.Dims)).I32(neox).
			F32(ts).F32(fs).Ptr(a.Factors).F32(a.Eps).
			Ptr(loc.pos).I32(loc.perToken).I32(int32(a.NTok)).I32(int32(hpb)).
			I32(int32(loc.store)).Ptr(loc.kc).Ptr(loc.vc).Ptr(loc.v).I32(int32(loc.kvType)).
			Ptr(loc.seq).Ptr(loc.tables).I32(int32(loc.maxBlocks)).I32(int32(loc.shift)).
			I32(int32(a.Rot)).I32(int32(rotV))
	})
}

// ropeLoc is where a rope launch reads positions and writes the cache: the
// kernel's position and store parameters.
type ropeLoc struct {
	pos, seq, tables, kc, vc, v cudadrv.DevicePtr
	perToken                    int32
	store                       int // tensor stored, -1 for none
	kvType                      KVType
	maxBlocks, shift            int
}

// locate checks the positions and the cache write of a.
func (a *RopeArgs) locate() (ropeLoc, error) {
	l := ropeLoc{store: -1}
	switch {
	case (a.Pos0 == 0) == (a.Batch == nil):
		return l, fmt.Errorf("kernels: rope needs the positions from exactly one of Pos0 and Batch")
	case a.Pos0 != 0:
		l.pos = a.Pos0
	default:
		shift, err := a.Batch.shift()
		if err != nil {
			return l, fmt.Errorf("kernels: rope: %w", err)
		}
		if a.First < 0 {
			return l, fmt.Errorf("kernels: rope of batch tokens from %d", a.First)
		}
		l.pos, l.seq, l.perToken = a.Batch.Pos.Add(4*a.First), a.Batch.Seq.Add(4*a.First), 1
		l.tables, l.maxBlocks, l.shift = a.Batch.Tables, a.Batch.MaxBlocks, shift
	}
	kv := a.KV
	if kv == nil {
		return l, nil
	}
	if kv.T < 0 || kv.T >= a.NTensors {
		return l, fmt.Errorf("kernels: rope stores tensor %d of %d", kv.T, a.NTensors)
	}
	l.store, l.v = kv.T, kv.V
	if a.Batch == nil {
		if kv.Cache != nil || kv.KC == 0 || kv.VC == 0 {
			return l, fmt.Errorf("kernels: rope at Pos0 stores to contiguous f16 caches KC and VC, not a paged Cache")
		}
		l.kc, l.vc, l.tables = kv.KC, kv.VC, 0
		return l, nil
	}
	c := kv.Cache
	if c == nil || kv.KC != 0 || kv.VC != 0 {
		return l, fmt.Errorf("kernels: rope of a batch stores to its paged Cache, not KC and VC")
	}
	if err := c.check(); err != nil {
		return l, fmt.Errorf("kernels: rope: %w", err)
	}
	if w := a.T[kv.T].Heads * a.HeadSize; w != c.Width {
		return l, fmt.Errorf("kernels: rope stores rows of %d values into a cache of %d", w, c.Width)
	}
	if c.Type.Quantized() && a.HeadSize%32 != 0 {
		return l, fmt.Errorf("kernels: rope's %v cache write needs heads of whole blocks of 32, not %d (use StoreKV)", c.Type, a.HeadSize)
	}
	l.kc, l.vc, l.kvType = c.K, c.V, c.Type
	return l, nil
}
