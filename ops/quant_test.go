package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/google/go-cmp/cmp"
)

// ---- Reference decoders, written from the block definitions in
// ggml-common.h in the plainest style, separately from the implementation:
// one element at a time, in float64.

func le16(b []byte) uint16  { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32  { return uint32(le16(b)) | uint32(le16(b[2:]))<<16 }
func half(b []byte) float64 { return refHalf(le16(b)) }

// nib32 is element i (0..31) of a legacy 4-bit block: element i < 16 is the
// low nibble of qs[i], element i >= 16 the high nibble of qs[i-16].
func nib32(qs []byte, i int) int {
	if i < 16 {
		return int(qs[i] & 15)
	}
	return int(qs[i-16] >> 4)
}

// twoBits is the 2-bit field of element i (0..255) in Q2_K/Q3_K's qs[64]:
// each 128-element half uses 32 bytes, and within it element r sits in byte
// r%32 at bit 2*(r/32).
func twoBits(qs []byte, i int) int {
	r := i % 128
	return int(qs[32*(i/128)+r%32]>>(2*(r/32))) & 3
}

// k4Scale is the 6-bit scale (m=false) or min (m=true) of sub-block j of a
// Q4_K/Q5_K scales[12] array.
func k4Scale(s []byte, j int, m bool) int {
	if j < 4 {
		if m {
			return int(s[j+4] & 63)
		}
		return int(s[j] & 63)
	}
	if m {
		return int(s[j+4]>>4) | int(s[j]>>6)<<4
	}
	return int(s[j+4]&15) | int(s[j-4]>>6)<<4
}

// q3Scale is the 6-bit Q3_K scale j (0..15), without its bias: low 4 bits in
// the low (j<8) or high (j>=8) nibble of byte j%8, high 2 bits at bit
// 2*(j/4) of byte 8+j%4.
func q3Scale(s []byte, j int) int {
	low := int(s[j%8]) >> (4 * (j / 8)) & 15
	high := int(s[8+j%4]) >> (2 * (j / 4)) & 3
	return low | high<<4
}

// refBlock is a decoded block: vals[i] = scaled[i] + offs[i], where offs is
// the block's min term (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) and mags[i] =
// |scaled[i]| + |offs[i]| bounds float32 rounding.
type refBlock struct{ vals, offs, mags []float64 }

// refDecode decodes one block.
func refDecode(t gguf.Type, b []byte) refBlock {
	info, _ := t.Info()
	r := refBlock{make([]float64, info.BlockSize), make([]float64, info.BlockSize), make([]float64, info.BlockSize)}
	set := func(i int, scaled, offset float64) {
		r.vals[i] = scaled + offset
		r.offs[i] = offset
		r.mags[i] = math.Abs(scaled) + math.Abs(offset)
	}
	for i := range r.vals {
		switch t {
		case gguf.TypeF32:
			set(i, float64(math.Float32frombits(le32(b))), 0)
		case gguf.TypeF16:
			set(i, half(b), 0)
		case gguf.TypeBF16:
			set(i, refBF16(le16(b)), 0)
		case gguf.TypeQ4_0: // {d; qs[16]}: d*(q-8)
			set(i, half(b)*float64(nib32(b[2:], i)-8), 0)
		case gguf.TypeQ4_1: // {d; m; qs[16]}: d*q + m
			set(i, half(b)*float64(nib32(b[4:], i)), half(b[2:]))
		case gguf.TypeQ5_0: // {d; qh[4]; qs[16]}: fifth bit of element i is bit i of qh
			q := nib32(b[6:], i) | int(le32(b[2:])>>i&1)<<4
			set(i, half(b)*float64(q-16), 0)
		case gguf.TypeQ5_1: // {d; m; qh[4]; qs[16]}
			q := nib32(b[8:], i) | int(le32(b[4:])>>i&1)<<4
			set(i, half(b)*float64(q), half(b[2:]))
		case gguf.TypeQ8_0: // {d; qs[32]}
			set(i, half(b)*float64(int8(b[2+i])), 0)
		case gguf.TypeQ8_1: // {d; s; qs[32]}
			set(i, half(b)*float64(int8(b[4+i])), 0)
		case gguf.TypeQ8_K: // {f32 d; qs[256]; bsums[16]}
			set(i, float64(math.Float32frombits(le32(b)))*float64(int8(b[4+i])), 0)
		case gguf.TypeQ2_K: // {scales[16]; qs[64]; d; dmin}: d*(sc&15)*q - dmin*(sc>>4)
			sc := b[i/16]
			set(i, half(b[80:])*float64(sc&15)*float64(twoBits(b[16:], i)), -half(b[82:])*float64(sc>>4))
		case gguf.TypeQ3_K: // {hmask[32]; qs[64]; scales[12]; d}: d*(sc-32)*(q-4+4*hbit)
			hbit := int(b[i%32]>>(i/32)) & 1
			q := twoBits(b[32:], i) - 4 + 4*hbit
			set(i, half(b[108:])*float64(q3Scale(b[96:], i/16)-32)*float64(q), 0)
		case gguf.TypeQ4_K, gguf.TypeQ5_K:
			// {d; dmin; scales[12]; [qh[32];] qs[128]}: d*sc*q - dmin*m, one
			// scale per 32; 64-element groups share 32 bytes, low nibbles first.
			qs := b[16:]
			if t == gguf.TypeQ5_K {
				qs = b[48:]
			}
			g, r := i/64, i%64
			q := int(qs[32*g+r%32])
			if r < 32 {
				q &= 15
			} else {
				q >>= 4
			}
			if t == gguf.TypeQ5_K { // fifth bit of element i: bit i/32 of qh[i%32]
				q |= int(b[16+i%32]>>(i/32)) & 1 << 4
			}
			s := b[4:16]
			set(i, half(b)*float64(k4Scale(s, i/32, false))*float64(q), -half(b[2:])*float64(k4Scale(s, i/32, true)))
		case gguf.TypeQ6_K:
			// {ql[128]; qh[64]; scales[16] (int8); d}: d*sc*(q-32). In each
			// 128-element half, element r's low nibble is in ql[r%32 + 32*((r/32)&1)]
			// (low nibble for r<64, high for r>=64), its 2 high bits in qh[r%32]
			// at bit 2*(r/32).
			h, r := i/128, i%128
			ql, qh := b[64*h:], b[128+32*h:]
			lo := int(ql[r%32+32*((r/32)&1)]) >> (4 * (r / 64)) & 15
			hi := int(qh[r%32]) >> (2 * (r / 32)) & 3
			set(i, half(b[208:])*float64(int8(b[192+i/16]))*float64(lo|hi<<4-32), 0)
		default:
			panic("refDecode: no reference for " + t.String())
		}
	}
	return r
}

func refDecodeRow(t gguf.Type, row []byte, n int) refBlock {
	info, _ := t.Info()
	var r refBlock
	for i := 0; i < n/info.BlockSize; i++ {
		b := refDecode(t, row[i*info.BlockBytes:(i+1)*info.BlockBytes])
		r.vals = append(r.vals, b.vals...)
		r.offs = append(r.offs, b.offs...)
		r.mags = append(r.mags, b.mags...)
	}
	return r
}

// refDot is the float64 dot product of n decoded weights of type t with
// activations xa in format act, and the sum of |terms| for tolerances.
// Against Q8_1 the weights' min term multiplies the block's stored
// s (≈ d*sum(q), rounded to half), as ggml does, not d*sum(q) itself.
func refDot(t, act gguf.Type, w, xa []byte, n int) (dot, mag float64) {
	wr := refDecodeRow(t, w, n)
	ar := refDecodeRow(act, xa, n)
	for i := range n {
		a := ar.vals[i]
		if act == gguf.TypeQ8_1 {
			s := half(xa[i/32*36+2:])
			dot += (wr.vals[i]-wr.offs[i])*a + wr.offs[i]*s/32
			mag += math.Abs(wr.vals[i]-wr.offs[i])*math.Abs(a) + math.Abs(wr.offs[i]*s/32)
			continue
		}
		dot += wr.vals[i] * a
		mag += wr.mags[i] * math.Abs(a)
	}
	return dot, mag
}

// ---- Random inputs.

// randHalfBits is a random finite half of magnitude in [2^-10, 2) and
// random sign: a "sensible" block scale.
func randHalfBits(rng *rand.Rand) uint16 {
	exp := uint16(5 + rng.IntN(11)) // 5..15 => 2^-10 .. 2^0
	return uint16(rng.IntN(2))<<15 | exp<<10 | uint16(rng.IntN(1024))
}

// scaleFields are the byte offsets of each format's half-precision scales.
var scaleFields = map[gguf.Type][]int{
	gguf.TypeQ4_0: {0}, gguf.TypeQ4_1: {0, 2}, gguf.TypeQ5_0: {0}, gguf.TypeQ5_1: {0, 2},
	gguf.TypeQ8_0: {0}, gguf.TypeQ8_1: {0, 2},
	gguf.TypeQ2_K: {80, 82}, gguf.TypeQ3_K: {108}, gguf.TypeQ4_K: {0, 2}, gguf.TypeQ5_K: {0, 2},
	gguf.TypeQ6_K: {208},
}

// randomRow makes n elements of type t from random bits: arbitrary quant
// bits, random sensible scales, and for the float types random finite
// values (F16 over its whole range, subnormals included).
func randomRow(t gguf.Type, n int, rng *rand.Rand) []byte {
	info, _ := t.Info()
	row := make([]byte, n/info.BlockSize*info.BlockBytes)
	for i := range row {
		row[i] = byte(rng.Uint32())
	}
	put16 := func(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }
	switch t {
	case gguf.TypeF32:
		for i := 0; i < len(row); i += 4 {
			f := math.Float32bits(float32(rng.NormFloat64() * math.Exp(4*rng.Float64()-2)))
			row[i], row[i+1], row[i+2], row[i+3] = byte(f), byte(f>>8), byte(f>>16), byte(f>>24)
		}
	case gguf.TypeF16:
		for i := 0; i < len(row); i += 2 {
			put16(row[i:], uint16(rng.IntN(2))<<15|uint16(rng.IntN(31))<<10|uint16(rng.IntN(1024)))
		}
	case gguf.TypeBF16:
		for i := 0; i < len(row); i += 2 {
			put16(row[i:], uint16(rng.IntN(2))<<15|uint16(127-20+rng.IntN(40))<<7|uint16(rng.IntN(128)))
		}
	default:
		for b := 0; b < len(row); b += info.BlockBytes {
			for _, off := range scaleFields[t] {
				put16(row[b+off:], randHalfBits(rng))
			}
		}
	}
	return row
}

// gaussRow is n Gaussian values whose scale varies by block of 32, with an
// occasional outlier, the shape of real activations and weights.
func gaussRow(n int, rng *rand.Rand) []float32 {
	x := make([]float32, n)
	s := 1.0
	for i := range x {
		if i%32 == 0 {
			s = math.Exp(3*rng.Float64() - 1.5)
		}
		x[i] = float32(rng.NormFloat64() * s)
		if rng.IntN(500) == 0 {
			x[i] *= 8
		}
	}
	return x
}

func allTypes() []gguf.Type { return SupportedTypes() }

// rowSizes gives element counts for t: one block, an odd number of blocks,
// and many blocks.
func rowSizes(t gguf.Type) []int {
	info, _ := t.Info()
	if info.BlockSize == 1 {
		return []int{1, 7, 1000}
	}
	return []int{info.BlockSize, 3 * info.BlockSize, 33 * info.BlockSize}
}

// ---- Tests.

func TestKernelTable(t *testing.T) {
	want := []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1,
		gguf.TypeQ8_0, gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeBF16}
	if diff := cmp.Diff(want, SupportedTypes()); diff != "" {
		t.Errorf("SupportedTypes() mismatch (-want +got):\n%s", diff)
	}
	act := map[gguf.Type]gguf.Type{
		gguf.TypeF32: gguf.TypeF32, gguf.TypeF16: gguf.TypeF16, gguf.TypeBF16: gguf.TypeBF16,
		gguf.TypeQ4_0: gguf.TypeQ8_0, gguf.TypeQ5_0: gguf.TypeQ8_0, gguf.TypeQ8_0: gguf.TypeQ8_0,
		gguf.TypeQ4_1: gguf.TypeQ8_1, gguf.TypeQ5_1: gguf.TypeQ8_1,
		gguf.TypeQ2_K: gguf.TypeQ8_K, gguf.TypeQ3_K: gguf.TypeQ8_K, gguf.TypeQ4_K: gguf.TypeQ8_K,
		gguf.TypeQ5_K: gguf.TypeQ8_K, gguf.TypeQ6_K: gguf.TypeQ8_K,
	}
	type sizes struct{ BlockSize, BlockBytes, Row4096, ActRow4096 int }
	wantSizes := map[gguf.Type]sizes{
		gguf.TypeF32: {1, 4, 16384, 16384}, gguf.TypeF16: {1, 2, 8192, 8192}, gguf.TypeBF16: {1, 2, 8192, 8192},
		gguf.TypeQ4_0: {32, 18, 2304, 4352}, gguf.TypeQ4_1: {32, 20, 2560, 4608},
		gguf.TypeQ5_0: {32, 22, 2816, 4352}, gguf.TypeQ5_1: {32, 24, 3072, 4608},
		gguf.TypeQ8_0: {32, 34, 4352, 4352},
		gguf.TypeQ2_K: {256, 84, 1344, 4672}, gguf.TypeQ3_K: {256, 110, 1760, 4672},
		gguf.TypeQ4_K: {256, 144, 2304, 4672}, gguf.TypeQ5_K: {256, 176, 2816, 4672},
		gguf.TypeQ6_K: {256, 210, 3360, 4672},
	}
	for _, typ := range SupportedTypes() {
		k, err := KernelFor(typ)
		if err != nil {
			t.Fatalf("KernelFor(%s): %v", typ, err)
		}
		if k.Type != typ || k.ActType != act[typ] {
			t.Errorf("%s: Type %s ActType %s, want ActType %s", typ, k.Type, k.ActType, act[typ])
		}
		got := sizes{k.BlockSize, k.BlockBytes, k.RowBytes(4096), k.ActRowBytes(4096)}
		if diff := cmp.Diff(wantSizes[typ], got); diff != "" {
			t.Errorf("%s sizes (-want +got):\n%s", typ, diff)
		}
		if k.Dequantize == nil || k.QuantizeAct == nil || k.Dot == nil {
			t.Errorf("%s: missing function", typ)
		}
	}
	for _, typ := range []gguf.Type{gguf.TypeQ8_K, gguf.TypeQ8_1, gguf.TypeIQ4_NL, gguf.TypeI32, gguf.Type(999)} {
		_, err := KernelFor(typ)
		if err == nil {
			t.Fatalf("KernelFor(%s): no error", typ)
		}
		if !strings.Contains(err.Error(), "Q4_K") || !strings.Contains(err.Error(), "BF16") || !strings.Contains(err.Error(), typ.String()) {
			t.Errorf("KernelFor(%s) error does not name the type and list supported ones: %v", typ, err)
		}
	}
}

func TestQuantizeDequantizeErrors(t *testing.T) {
	if err := Quantize(gguf.TypeQ4_K, make([]byte, 144), make([]float32, 100)); err == nil {
		t.Error("Quantize with a partial block: no error")
	}
	if err := Quantize(gguf.TypeQ4_K, make([]byte, 143), make([]float32, 256)); err == nil {
		t.Error("Quantize into a short dst: no error")
	}
	if err := Quantize(gguf.TypeIQ2_XXS, make([]byte, 1000), make([]float32, 256)); err == nil {
		t.Error("Quantize to an unsupported type: no error")
	}
	if err := DequantizeRow(gguf.TypeQ8_0, make([]float32, 64), make([]byte, 67)); err == nil {
		t.Error("DequantizeRow from a short src: no error")
	}
	if err := DequantizeRow(gguf.TypeQ8_0, make([]float32, 40), make([]byte, 100)); err == nil {
		t.Error("DequantizeRow with a partial block: no error")
	}
	if err := DequantizeRow(gguf.TypeTQ1_0, make([]float32, 256), make([]byte, 1000)); err == nil {
		t.Error("DequantizeRow of an unsupported type: no error")
	}
}

// TestDequantizeMatchesReference decodes random blocks (random quant bits,
// random scales) and compares every element with the reference decoder.
func TestDequantizeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 20))
	types := append(allTypes(), gguf.TypeQ8_1, gguf.TypeQ8_K)
	for _, typ := range types {
		for _, n := range rowSizes(typ) {
			for rep := range 5 {
				row := randomRow(typ, n, rng)
				if typ == gguf.TypeQ8_K { // any f32 d will do; give it a sensible one
					for b := 0; b < len(row); b += blockQ8_K {
						putF32(row[b:], float32(rng.NormFloat64()))
					}
				}
				got := make([]float32, n)
				if err := DequantizeRow(typ, got, row); err != nil {
					t.Fatal(err)
				}
				if k, err := KernelFor(typ); err == nil {
					viaKernel := make([]float32, n)
					k.Dequantize(viaKernel, row)
					if diff := cmp.Diff(got, viaKernel); diff != "" {
						t.Fatalf("%s: Kernel.Dequantize differs from DequantizeRow:\n%s", typ, diff)
					}
				}
				ref := refDecodeRow(typ, row, n)
				for i := range got {
					tol := 0x1p-22*ref.mags[i] + 1e-40
					if d := math.Abs(float64(got[i]) - ref.vals[i]); !(d <= tol) {
						t.Fatalf("%s n=%d rep=%d: element %d = %g, reference %g (diff %g > %g)",
							typ, n, rep, i, got[i], ref.vals[i], d, tol)
					}
				}
			}
		}
	}
}

// actError bounds |dequant(quantize_act(x))_i - x_i| for element i of a
// block whose largest magnitude is amax.
func actError(act gguf.Type, x, amax float64) float64 {
	switch act {
	case gguf.TypeQ8_0, gguf.TypeQ8_1:
		// Rounding to q (half a step of amax/127), plus d rounded to half
		// (relative 2^-11, times |q| <= 127).
		return amax*(0.5/127+0x1p-11)*(1+1e-5) + 1e-38
	case gguf.TypeQ8_K:
		return amax * 0.5 / 127 * (1 + 1e-5)
	case gguf.TypeF16:
		return math.Abs(x)*0x1p-11 + 0x1p-25
	case gguf.TypeBF16:
		return math.Abs(x) * 0x1p-8
	}
	return 0 // F32
}

// TestDot checks Dot against two float64 references: the exact dot of the
// decoded weights with the decoded quantized activations (tight: only
// float32 rounding separates them), and the exact dot of the decoded weights
// with the original activations (loose: the activation quantization error,
// bounded element by element).
func TestDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(30, 40))
	for _, typ := range allTypes() {
		k, _ := KernelFor(typ)
		actInfo, _ := k.ActType.Info()
		for _, n := range rowSizes(typ) {
			for rep := range 6 {
				var w []byte
				if rep%2 == 0 {
					w = randomRow(typ, n, rng)
				} else { // realistic weights too
					w = make([]byte, k.RowBytes(n))
					if err := Quantize(typ, w, gaussRow(n, rng)); err != nil {
						t.Fatal(err)
					}
				}
				x := gaussRow(n, rng)
				xa := make([]byte, k.ActRowBytes(n))
				k.QuantizeAct(xa, x)
				got := float64(k.Dot(n, w, xa))

				want1, mag1 := refDot(typ, k.ActType, w, xa, n)
				wr := refDecodeRow(typ, w, n)
				var want2, err2 float64
				for i := range n {
					want2 += wr.vals[i] * float64(x[i])
					b := i / actInfo.BlockSize * actInfo.BlockSize
					var amax float64
					for _, v := range x[b : b+actInfo.BlockSize] {
						amax = max(amax, math.Abs(float64(v)))
					}
					// mags, not |vals|: the min term meets the summed error of its block.
					err2 += wr.mags[i] * actError(k.ActType, float64(x[i]), amax)
				}
				tol1 := 1e-5*mag1 + 1e-30
				if d := math.Abs(got - want1); !(d <= tol1) {
					t.Errorf("%s n=%d rep=%d: Dot = %g, exact dot of the decoded rows %g (diff %g > %g)",
						typ, n, rep, got, want1, d, tol1)
				}
				if d := math.Abs(got - want2); !(d <= tol1+err2) {
					t.Errorf("%s n=%d rep=%d: Dot = %g, dot with unquantized activations %g (diff %g > %g)",
						typ, n, rep, got, want2, d, tol1+err2)
				}
			}
		}
	}
}

// q8Block is a decoded Q8_0/Q8_1/Q8_K block, for comparing with go-cmp.
type q8Block struct {
	D, S  float32 // S: Q8_1 only
	Qs    []int8
	Bsums []int16 // Q8_K only
}

func decodeQ8(t gguf.Type, b []byte) q8Block {
	var blk q8Block
	switch t {
	case gguf.TypeQ8_0:
		blk.D, b = F16ToF32(le16(b)), b[2:34]
	case gguf.TypeQ8_1:
		blk.D, blk.S, b = F16ToF32(le16(b)), F16ToF32(le16(b[2:])), b[4:36]
	case gguf.TypeQ8_K:
		blk.D = math.Float32frombits(le32(b))
		for j := range 16 {
			blk.Bsums = append(blk.Bsums, int16(le16(b[4+256+2*j:])))
		}
		b = b[4:260]
	}
	for _, q := range b {
		blk.Qs = append(blk.Qs, int8(q))
	}
	return blk
}

// TestQuantizeActRules checks the activation quantizers against their
// definitions in llama.cpp, rounding rule included.
func TestQuantizeActRules(t *testing.T) {
	// Q8_0 / Q8_1 (quantize_row_q8_0_ref / _q8_1_ref): d = amax/127,
	// q = roundf(x * (1/d)), halves away from zero. With amax = 127, d = 1.
	x := make([]float32, 32)
	copy(x, []float32{127, 2.5, -2.5, 3.5, -0.5, 0.49, 126.5, -127})
	wantQs := []int8{127, 3, -3, 4, -1, 0, 127, -127}
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ8_1} {
		b := make([]byte, 36)
		actQuantizers[typ](b, x)
		got := decodeQ8(typ, b)
		want := q8Block{D: 1, Qs: append(append([]int8{}, wantQs...), make([]int8, 24)...)}
		if typ == gguf.TypeQ8_1 {
			want.S = 127 + 3 - 3 + 4 - 1 + 0 + 127 - 127
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s ties (-want +got):\n%s", typ, diff)
		}
	}

	// Q8_K (quantize_row_q8_K_ref): iscale = -127/max with max the signed
	// value of largest magnitude, nearest_int (halves to even), clamp 127,
	// d = 1/iscale in float32, bsums per 16.
	xk := make([]float32, 256)
	copy(xk, []float32{-127, 2.5, 3.5, -2.5, 0.5, 1.5, 127})
	b := make([]byte, blockQ8_K)
	quantActQ8_K(b, xk)
	got := decodeQ8(gguf.TypeQ8_K, b)
	want := q8Block{D: 1, Qs: make([]int8, 256), Bsums: make([]int16, 16)}
	copy(want.Qs, []int8{-127, 2, 4, -2, 0, 2, 127})
	want.Bsums[0] = -127 + 2 + 4 - 2 + 0 + 2 + 127
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Q8_K ties (-want +got):\n%s", diff)
	}
	// A positive maximum maps to -127 and d is negative.
	xk[0] = 254
	quantActQ8_K(b, xk)
	got = decodeQ8(gguf.TypeQ8_K, b)
	if got.D != -2 || got.Qs[0] != -127 || got.Qs[6] != -64 || got.Qs[1] != -1 {
		t.Errorf("Q8_K with positive max: d=%v qs=%v", got.D, got.Qs[:8])
	}

	// Random rows: every field follows its definition.
	rng := rand.New(rand.NewPCG(50, 60))
	for range 50 {
		x := gaussRow(512, rng)
		for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ8_1, gguf.TypeQ8_K} {
			info, _ := typ.Info()
			buf := make([]byte, 512/info.BlockSize*info.BlockBytes)
			actQuantizers[typ](buf, x)
			for bi := 0; bi < 512/info.BlockSize; bi++ {
				xs := x[bi*info.BlockSize:][:info.BlockSize]
				got := decodeQ8(typ, buf[bi*info.BlockBytes:])
				var want q8Block
				var amax, vmax float32
				for _, v := range xs {
					if float32(math.Abs(float64(v))) > amax {
						amax, vmax = float32(math.Abs(float64(v))), v
					}
				}
				if typ == gguf.TypeQ8_K {
					iscale := -127 / vmax
					want.D = 1 / iscale
					want.Bsums = make([]int16, 16)
					for j, v := range xs {
						q := int8(min(127, math.RoundToEven(float64(iscale*v))))
						want.Qs = append(want.Qs, q)
						want.Bsums[j/16] += int16(q)
					}
				} else {
					d := amax / 127
					id := 1 / d
					want.D = F16ToF32(F32ToF16(d))
					sum := 0
					for _, v := range xs {
						q := int8(math.Round(float64(v * id)))
						want.Qs = append(want.Qs, q)
						sum += int(q)
					}
					if typ == gguf.TypeQ8_1 {
						want.S = F16ToF32(F32ToF16(float32(sum) * d))
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s block %d (-want +got):\n%s", typ, bi, diff)
				}
			}
		}
	}

	// All-zero blocks quantize to all-zero blocks.
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ8_1, gguf.TypeQ8_K} {
		info, _ := typ.Info()
		buf := make([]byte, info.BlockBytes)
		for i := range buf {
			buf[i] = 0xff
		}
		actQuantizers[typ](buf, make([]float32, info.BlockSize))
		for i, v := range buf {
			if v != 0 {
				t.Fatalf("%s of zeros: byte %d = %#x", typ, i, v)
			}
		}
	}
}

func nmse(x []float32, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return num / den
}

// roundTripNMSE bounds the normalised squared error of Quantize then
// Dequantize on Gaussian rows, plain and with block-varying scale and
// outliers. The quantizers match llama.cpp's reference ones bit for bit, so
// these are llama.cpp's errors; measured worst values (logged by the test)
// are in the comments, the bounds leave about 1.4x margin.
var roundTripNMSE = map[gguf.Type]float64{
	gguf.TypeF32:  0,
	gguf.TypeF16:  1e-7,   // 4.3e-8
	gguf.TypeBF16: 5e-6,   // 2.8e-6
	gguf.TypeQ8_0: 1e-4,   // 5.0e-5
	gguf.TypeQ6_K: 1e-3,   // 6.2e-4
	gguf.TypeQ5_0: 5e-3,   // 3.4e-3
	gguf.TypeQ5_1: 3e-3,   // 1.6e-3
	gguf.TypeQ5_K: 3e-3,   // 1.5e-3
	gguf.TypeQ4_0: 1.8e-2, // 1.2e-2
	gguf.TypeQ4_1: 1e-2,   // 7.1e-3
	gguf.TypeQ4_K: 1e-2,   // 6.5e-3
	gguf.TypeQ3_K: 5.5e-2, // 3.8e-2
	gguf.TypeQ2_K: 1.3e-1, // 9.1e-2
}

func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(70, 80))
	const n = 32 * 256
	for _, typ := range allTypes() {
		k, _ := KernelFor(typ)
		var worst float64
		for rep := range 4 {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			if rep >= 2 { // Gaussian with varying scale and outliers
				x = gaussRow(n, rng)
			}
			q := make([]byte, k.RowBytes(n))
			if err := Quantize(typ, q, x); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, n)
			k.Dequantize(y, q)
			worst = max(worst, nmse(x, y))
		}
		t.Logf("%-5s round-trip NMSE %.3g (bound %.3g)", typ, worst, roundTripNMSE[typ])
		if !(worst <= roundTripNMSE[typ]) {
			t.Errorf("%s: round-trip NMSE %g > %g", typ, worst, roundTripNMSE[typ])
		}
	}
}

// TestQuantizeEdgeRows: zero, constant, tiny and huge rows must decode to
// finite values; zero rows to zeros; constants and moderate rows closely.
func TestQuantizeEdgeRows(t *testing.T) {
	const n = 512
	fill := func(v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v
		}
		return x
	}
	rng := rand.New(rand.NewPCG(90, 100))
	scaled := func(s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * s)
		}
		return x
	}
	spike := make([]float32, n)
	spike[77] = 5
	spike[300] = -1e-3
	rows := []struct {
		name string
		x    []float32
		tol  float64 // max |y-x| relative to max|x|; 0: only finiteness
	}{
		{"zero", fill(0), 0},
		{"const+1", fill(1), 0.01},
		{"const-3", fill(-3), 0.01},
		// Small rows push k-quant super-block scales into half subnormals.
		{"const1e-3", fill(1e-3), 0.1},
		{"spike", spike, 0.01},
		{"gauss3e3", scaled(3e3), 0.3},
		{"tiny1e-9", scaled(1e-9), 0},
		{"huge1e10", scaled(1e10), 0},
		{"huge3e37", scaled(3e37), 0},
	}
	for _, typ := range allTypes() {
		k, _ := KernelFor(typ)
		for _, r := range rows {
			q := make([]byte, k.RowBytes(n))
			if err := Quantize(typ, q, r.x); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, n)
			k.Dequantize(y, q)
			var amax float64
			for _, v := range r.x {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i, v := range y {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					if typ == gguf.TypeF16 && r.name[:4] == "huge" {
						continue // F16 has no finite value for 1e10; infinity is the right answer
					}
					t.Fatalf("%s %s: element %d = %v", typ, r.name, i, v)
				}
				if r.name == "zero" && v != 0 {
					t.Fatalf("%s zero row: element %d = %v", typ, i, v)
				}
				if r.tol > 0 {
					if d := math.Abs(float64(v) - float64(r.x[i])); d > r.tol*amax {
						t.Fatalf("%s %s: element %d = %v, want %v (error %g > %g)", typ, r.name, i, v, r.x[i], d, r.tol*amax)
					}
				}
			}
			// The dot product with these weights stays finite too.
			if info, _ := typ.Info(); info.Quantized || r.name[:4] != "huge" {
				x := gaussRow(n, rng)
				xa := make([]byte, k.ActRowBytes(n))
				k.QuantizeAct(xa, x)
				if d := k.Dot(n, q, xa); math.IsNaN(float64(d)) || (math.IsInf(float64(d), 0) && r.name != "huge3e37") {
					t.Errorf("%s %s: Dot = %v", typ, r.name, d)
				}
			}
		}
	}
}

// TestMultiRow checks that rows quantized together equal rows quantized one
// by one (blocks are independent), and that a matrix-vector product built
// from Dot matches the dequantized float64 product.
func TestMultiRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(110, 120))
	const rows = 5
	for _, typ := range allTypes() {
		k, _ := KernelFor(typ)
		n := 3 * k.BlockSize * max(1, 256/k.BlockSize)
		if k.BlockSize == 32 {
			n = 7 * 32
		}
		x := gaussRow(rows*n, rng)
		all := make([]byte, rows*k.RowBytes(n))
		if err := Quantize(typ, all, x); err != nil {
			t.Fatal(err)
		}
		one := make([]byte, k.RowBytes(n))
		act := gaussRow(n, rng)
		xa := make([]byte, k.ActRowBytes(n))
		k.QuantizeAct(xa, act)
		for r := range rows {
			if err := Quantize(typ, one, x[r*n:(r+1)*n]); err != nil {
				t.Fatal(err)
			}
			rowBytes := all[r*k.RowBytes(n) : (r+1)*k.RowBytes(n)]
			if diff := cmp.Diff(one, rowBytes); diff != "" {
				t.Fatalf("%s row %d: quantized alone differs from quantized together", typ, r)
			}
			got := float64(k.Dot(n, rowBytes, xa))
			want, mag := refDot(typ, k.ActType, rowBytes, xa, n)
			if d := math.Abs(got - want); d > 1e-5*mag+1e-30 {
				t.Errorf("%s row %d: Dot %g, want %g", typ, r, got, want)
			}
		}
	}
}

func TestNoAllocations(t *testing.T) {
	rng := rand.New(rand.NewPCG(130, 140))
	const n = 1024
	for _, typ := range allTypes() {
		k, _ := KernelFor(typ)
		w := randomRow(typ, n, rng)
		x := gaussRow(n, rng)
		xa := make([]byte, k.ActRowBytes(n))
		y := make([]float32, n)
		allocs := testing.AllocsPerRun(10, func() {
			k.QuantizeAct(xa, x)
			k.Dot(n, w, xa)
			k.Dequantize(y, w)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per QuantizeAct+Dot+Dequantize", typ, allocs)
		}
	}
}

func BenchmarkDot(b *testing.B) {
	const n = 4096
	for _, typ := range SupportedTypes() {
		k, _ := KernelFor(typ)
		rng := rand.New(rand.NewPCG(1, 1))
		w := randomRow(typ, n, rng)
		xa := make([]byte, k.ActRowBytes(n))
		k.QuantizeAct(xa, gaussRow(n, rng))
		b.Run(fmt.Sprint(typ), func(b *testing.B) {
			b.SetBytes(int64(k.RowBytes(n)))
			for b.Loop() {
				k.Dot(n, w, xa)
			}
		})
	}
}

func BenchmarkQuantizeAct(b *testing.B) {
	const n = 4096
	x := gaussRow(n, rand.New(rand.NewPCG(2, 2)))
	for _, act := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ8_K} {
		info, _ := act.Info()
		dst := make([]byte, n/info.BlockSize*info.BlockBytes)
		b.Run(fmt.Sprint(act), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				actQuantizers[act](dst, x)
			}
		})
	}
}
