package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/atsinfer/ats/gguf"
)

// Random tensor data, written block by block in the final encoding: random
// quant bits plus scales chosen so that every block decodes to values with
// mean 0 (exactly, by symmetry) and the wanted standard deviation. Nothing
// is quantized from floats, which is what makes a 9 GiB model take seconds.
//
// Block layouts written here (ggml's, little-endian, no padding):
//
//	Q8_0 (34 B / 32):  f16 d; i8 qs[32]                    x = d*q
//	Q5_0 (22 B / 32):  f16 d; u8 qh[4]; u8 qs[16]          x = d*(q-16), q 5-bit: low nibble in qs, bit 4 in qh
//	Q5_1 (24 B / 32):  f16 d; f16 m; u8 qh[4]; u8 qs[16]   x = d*q + m
//	Q4_K (144 B / 256): f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
//	                   8 sub-blocks of 32: x = d*sc*q - dmin*m, q 4-bit,
//	                   sc and m 6-bit, packed as get_scale_min_k4 reads them
//	Q5_K (176 B / 256): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
//	                   as Q4_K with a fifth quant bit in qh
//	Q6_K (210 B / 256): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
//	                   16 sub-blocks of 16: x = d*sc*(q-32), q 6-bit (low 4 in ql, high 2 in qh)
//
// How each is centred:
//   - Q4_K, Q5_K, Q5_1: the quants are uniform on 0..2^b-1; the offset is set
//     to exactly half the range (m = sc, dmin = 7.5*d or 15.5*d; d is rounded
//     so that this product is exact in f16), so x is symmetric about 0.
//   - Q8_0: the one asymmetric quant, -128, is replaced by 0.
//   - Q6_K, Q5_0: q-32 and q-16 lean by half a step towards negative values,
//     so neighbouring sub-blocks (Q6_K) or blocks (Q5_0) get scales of
//     opposite sign and equal size: each such pair (32 or 64 consecutive
//     values) is centred. llama.cpp's own quantizer writes negative Q6_K
//     scales and Q5_0 d too.
//
// F32 values are uniform on mean ± a (2^23 levels); F16 ones take one of
// 4096 evenly spaced levels, rounded to f16 once into a table.
//
// Scales d (and the sub-block scales) vary a little from block to block, as
// real ones do. For very wide rows d can be an f16 subnormal, as in real files;
// it is always finite.

// rng is wyrand: one 64x64->128 multiply per 64 random bits. Each chunk of
// a tensor gets its own, seeded from (seed, tensor, chunk), so the output
// does not depend on how chunks are spread over threads.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

// mix is the splitmix64 finaliser, used to derive seeds.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// chunkSeed seeds the generator of one chunk of one tensor.
func chunkSeed(seed uint64, tensor string, chunk int64) uint64 {
	h := uint64(0xcbf29ce484222325) // FNV-1a of the name
	for i := 0; i < len(tensor); i++ {
		h = (h ^ uint64(tensor[i])) * 0x100000001b3
	}
	return mix(mix(seed^h) + uint64(chunk))
}

// generator fills whole blocks of one tensor. first is the index of dst's
// first block in the tensor (some layouts alternate signs by block).
type generator interface {
	fill(dst []byte, first int64, r *rng)
}

// dist is what a tensor's values should look like.
type dist struct {
	mean float64
	std  float64
}

// distFor is the value distribution of a tensor: projections and
// embeddings N(0, 1/sqrt(row length)) in spirit (so a product with a
// unit-RMS vector stays near unit RMS and activations stay finite through
// any depth), norm weights near 1, biases small.
func distFor(t tensorDef) dist {
	switch t.role {
	case roleNorm:
		return dist{mean: 1, std: 0.1 / math.Sqrt(3)} // uniform on 1 ± 0.1
	case roleBias:
		return dist{std: 0.02}
	}
	return dist{std: 1 / math.Sqrt(float64(t.dims[0]))}
}

// newGenerator makes the generator of a tensor of type typ.
func newGenerator(t tensorDef, typ gguf.Type, p Preset) (generator, error) {
	if t.role == roleRopeFreqs {
		if typ != gguf.TypeF32 {
			return nil, fmt.Errorf("rope_freqs must be F32, not %s", typ)
		}
		return constF32(p.ropeFreqs()), nil
	}
	d := distFor(t)
	switch typ {
	case gguf.TypeF32:
		return uniformF32{mean: float32(d.mean), step: float32(d.std * math.Sqrt(3) / (1 << 23))}, nil
	case gguf.TypeF16:
		return newUniformF16(d.mean, d.std*math.Sqrt(3)), nil
	}
	if d.mean != 0 {
		return nil, fmt.Errorf("quantized %s tensors must have mean 0", typ)
	}
	// rms of the scale jitter table below, so that the result has std d.std
	jit := jitterRMS()
	switch typ {
	case gguf.TypeQ8_0:
		// q uniform on -127..127 with 0 twice as likely: E[q²] = 2·Σk²/256.
		return &q8_0{d: scaleTable(d.std/(jit*math.Sqrt(5397.5)), 0)}, nil
	case gguf.TypeQ5_0:
		// q-16 uniform on -16..15: E[(q-16)²] = 85.5.
		return &q5_0{d: scaleTable(d.std/(jit*math.Sqrt(85.5)), 0)}, nil
	case gguf.TypeQ5_1:
		// q-15.5 uniform on ±0.5..±15.5: E = (32²-1)/12; m = -15.5*d exact
		// when d has its low 5 mantissa bits clear.
		g := &q5_1{d: scaleTable(d.std/(jit*math.Sqrt(85.25)), 5)}
		for i, h := range g.d {
			g.m[i] = f32ToF16(-15.5 * f16ToF32(h))
		}
		return g, nil
	case gguf.TypeQ4_K, gguf.TypeQ5_K:
		// x = d*sc*(q - c) with sc uniform on 16..31 (E[sc²] = 573.5) and
		// q - c uniform on ±0.5..±c, c = 7.5 (4-bit q) or 15.5 (5-bit q):
		// E[(q-c)²] = ((2c+1)² - 1)/12.
		c, clear := 7.5, uint(4)
		if typ == gguf.TypeQ5_K {
			c, clear = 15.5, 5
		}
		eq := ((2*c+1)*(2*c+1) - 1) / 12
		g := &kquant{five: typ == gguf.TypeQ5_K, d: scaleTable(d.std/(jit*math.Sqrt(573.5*eq)), clear)}
		for i, h := range g.d {
			g.dmin[i] = f32ToF16(float32(c) * f16ToF32(h))
		}
		return g, nil
	case gguf.TypeQ6_K:
		// x = d*sc*(q-32): |sc| uniform on 16..31, q-32 uniform on -32..31
		// (E[(q-32)²] = 341.5).
		return &q6_K{d: scaleTable(d.std/(jit*math.Sqrt(573.5*341.5)), 0)}, nil
	}
	return nil, fmt.Errorf("no generator for type %s", typ)
}

// The block scale d is drawn from 16 values spread evenly over ±25% of base.
func jitter(k int) float64 { return 0.75 + 0.5*(float64(k)+0.5)/16 }

func jitterRMS() float64 {
	var s float64
	for k := range 16 {
		s += jitter(k) * jitter(k)
	}
	return math.Sqrt(s / 16)
}

// scaleTable is the 16 f16 block scales around base, with the low clear
// mantissa bits zeroed (see kquant: it makes c*d exact in f16).
func scaleTable(base float64, clear uint) [16]uint16 {
	var t [16]uint16
	for k := range t {
		h := f32ToF16(float32(base * jitter(k)))
		if h&0x7fff >= 1<<clear { // keep tiny values from becoming 0
			h &^= 1<<clear - 1
		}
		t[k] = h
	}
	return t
}

// constF32 is a tensor whose values are given (rope_freqs).
type constF32 []float32

func (c constF32) fill(dst []byte, first int64, _ *rng) {
	for i := 0; i < len(dst)/4; i++ {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(c[first+int64(i)]))
	}
}

// uniform23 turns 23 random bits into one of 2^23 odd integers symmetric
// about 0, exactly representable in float32.
func uniform23(x uint64) float32 { return float32(int32(x&(1<<23-1))*2 + 1 - 1<<23) }

// uniformF32 writes mean + U(-a, a) with a = step·2^23.
type uniformF32 struct{ mean, step float32 }

func (g uniformF32) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	n := len(dst) / 4
	i := 0
	for ; i+2 <= n; i += 2 {
		x := r.next()
		le.PutUint32(dst[4*i:], math.Float32bits(g.mean+uniform23(x)*g.step))
		le.PutUint32(dst[4*i+4:], math.Float32bits(g.mean+uniform23(x>>32)*g.step))
	}
	if i < n {
		le.PutUint32(dst[4*i:], math.Float32bits(g.mean+uniform23(r.next())*g.step))
	}
}

// uniformF16 draws from 4096 evenly spaced values over mean ± a, rounded
// to f16 once, in a table (f16 keeps 11 significant bits, so a finer grid
// would change nothing): five table lookups per 64 random bits, against
// a float conversion per value.
type uniformF16 struct{ table *[4096]uint16 }

func newUniformF16(mean, a float64) uniformF16 {
	t := new([4096]uint16)
	for k := range t {
		t[k] = f32ToF16(float32(mean + a*float64(2*k+1-4096)/4096))
	}
	return uniformF16{t}
}

func (g uniformF16) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	n := len(dst) / 2
	for i := 0; i < n; i += 5 {
		x := r.next()
		for k := i; k < min(i+5, n); k++ {
			le.PutUint16(dst[2*k:], g.table[x&4095])
			x >>= 12
		}
	}
}

// noMinus128 replaces every 0x80 byte (int8 -128) of x by 0x00, so the
// int8 quants are symmetric about 0.
func noMinus128(x uint64) uint64 {
	const lo7, hi = 0x7f7f7f7f7f7f7f7f, 0x8080808080808080
	t := x ^ hi                          // 0x80 bytes become 0x00
	z := ^((t&lo7 + lo7) | t | lo7) & hi // high bit set exactly where t's byte is 0
	return x &^ (z >> 7 * 0xff)
}

type q8_0 struct{ d [16]uint16 }

func (g *q8_0) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	for o := 0; o+34 <= len(dst); o += 34 {
		b := dst[o : o+34 : o+34]
		x := r.next()
		le.PutUint16(b[0:], g.d[x&15])
		le.PutUint64(b[2:], noMinus128(r.next()))
		le.PutUint64(b[10:], noMinus128(r.next()))
		le.PutUint64(b[18:], noMinus128(r.next()))
		le.PutUint64(b[26:], noMinus128(r.next()))
	}
}

type q5_0 struct{ d [16]uint16 }

func (g *q5_0) fill(dst []byte, first int64, r *rng) {
	le := binary.LittleEndian
	for i, o := first, 0; o+22 <= len(dst); i, o = i+1, o+22 {
		b := dst[o : o+22 : o+22]
		x := r.next()
		d := g.d[x&15]
		if i&1 == 1 { // odd blocks mirror even ones (see the top of this file)
			d |= 0x8000
		}
		le.PutUint16(b[0:], d)
		le.PutUint32(b[2:], uint32(x>>32))
		le.PutUint64(b[6:], r.next())
		le.PutUint64(b[14:], r.next())
	}
}

type q5_1 struct{ d, m [16]uint16 }

func (g *q5_1) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	for o := 0; o+24 <= len(dst); o += 24 {
		b := dst[o : o+24 : o+24]
		x := r.next()
		le.PutUint16(b[0:], g.d[x&15])
		le.PutUint16(b[2:], g.m[x&15])
		le.PutUint32(b[4:], uint32(x>>32))
		le.PutUint64(b[8:], r.next())
		le.PutUint64(b[16:], r.next())
	}
}

// kquant writes Q4_K, or Q5_K when five is set.
type kquant struct {
	five    bool
	d, dmin [16]uint16
}

func (g *kquant) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	size := 144
	if g.five {
		size = 176
	}
	for o := 0; o+size <= len(dst); o += size {
		b := dst[o : o+size : o+size]
		x := r.next()
		k := x & 15
		le.PutUint16(b[0:], g.d[k])
		le.PutUint16(b[2:], g.dmin[k])
		// Sub-block scales sc (and mins m = sc) uniform on 16..31.
		var sc [8]uint8
		for j := range sc {
			sc[j] = 16 | uint8(x>>(4+4*j))&15
		}
		packScalesK4(b[4:16], sc, sc)
		for i := 16; i < size; i += 8 { // qh (Q5_K) and qs: all random
			le.PutUint64(b[i:], r.next())
		}
	}
}

// packScalesK4 packs eight 6-bit scales and mins into 12 bytes, the inverse
// of ggml's get_scale_min_k4: bytes 0-3 hold sc[0..3] and the top two bits of
// sc[4..7], bytes 4-7 m[0..3] and the top bits of m[4..7], bytes 8-11 the low
// nibbles of sc[4..7] and m[4..7].
func packScalesK4(b []byte, sc, m [8]uint8) {
	for j := range 4 {
		b[j] = sc[j]&63 | (sc[j+4]>>4)<<6
		b[j+4] = m[j]&63 | (m[j+4]>>4)<<6
		b[j+8] = sc[j+4]&15 | (m[j+4]&15)<<4
	}
}

type q6_K struct{ d [16]uint16 }

func (g *q6_K) fill(dst []byte, _ int64, r *rng) {
	le := binary.LittleEndian
	for o := 0; o+210 <= len(dst); o += 210 {
		b := dst[o : o+210 : o+210]
		for i := 0; i < 192; i += 8 { // ql and qh: all random
			le.PutUint64(b[i:], r.next())
		}
		x := r.next()
		for j := range 8 { // sub-blocks 2j and 2j+1: scales +s and -s
			s := int8(16 | (x>>(4*j))&15)
			b[192+2*j] = byte(s)
			b[192+2*j+1] = byte(-s)
		}
		le.PutUint16(b[208:], g.d[x>>60])
	}
}

// f32ToF16 converts to IEEE half precision, rounding to nearest even,
// subnormals included (scales of wide rows can be that small).
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	e := int(b>>23) & 0xff
	m := b & 0x7fffff
	if e == 0xff { // Inf, NaN
		if m != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	exp := e - 127 + 15
	if exp >= 31 {
		return sign | 0x7c00
	}
	if exp >= 1 {
		// A carry out of the mantissa bumps the exponent, as it should.
		return sign | uint16(exp<<10) + uint16(roundShift(m, 13))
	}
	if e == 0 || exp < -10 {
		return sign // too small even for a subnormal (f32 subnormals too)
	}
	return sign | uint16(roundShift(m|0x800000, uint(14-exp)))
}

// roundShift is m >> s rounded to nearest, ties to even.
func roundShift(m uint32, s uint) uint32 {
	r := m >> s
	rem := m & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++
	}
	return r
}

// f16ToF32 converts from IEEE half precision.
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 31
	m := uint32(h & 0x3ff)
	switch {
	case e == 31:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	case e == 0:
		v := float32(m) / (1 << 24)
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (e+127-15)<<23 | m<<13)
}
