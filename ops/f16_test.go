package ops

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// refHalf decodes a binary16 bit pattern from its definition, in float64.
func refHalf(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * mant / 1024 * math.Pow(2, -14)
	case 31:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * (1 + mant/1024) * math.Pow(2, float64(exp-15))
}

// ggmlFP32ToFP16 is ggml's portable ggml_compute_fp32_to_fp16 (from the FP16
// library), transcribed into Go to check F32ToF16 bit for bit against it.
func ggmlFP32ToFP16(f float32) uint16 {
	const scaleToInf float32 = 0x1.0p+112
	const scaleToZero float32 = 0x1.0p-110
	base := (abs32(f) * scaleToInf) * scaleToZero
	w := math.Float32bits(f)
	shl1W := w + w
	sign := w & 0x80000000
	bias := shl1W & 0xff000000
	if bias < 0x71000000 {
		bias = 0x71000000
	}
	base = math.Float32frombits(bias>>1+0x07800000) + base
	bits := math.Float32bits(base)
	expBits := (bits >> 13) & 0x00007c00
	mantBits := bits & 0x00000fff
	nonsign := expBits + mantBits
	if shl1W > 0xff000000 {
		return uint16(sign>>16) | 0x7e00
	}
	return uint16(sign>>16) | uint16(nonsign)
}

func isNaN32(f float32) bool { return f != f }

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := F16ToF32(h)
		want := refHalf(h)
		if math.IsNaN(want) {
			if !isNaN32(got) {
				t.Fatalf("F16ToF32(%#04x) = %v, want NaN", h, got)
			}
			if back := F32ToF16(got); back&0x7c00 != 0x7c00 || back&0x3ff == 0 || back&0x8000 != h&0x8000 {
				t.Fatalf("F32ToF16(NaN from %#04x) = %#04x, want a NaN with the same sign", h, back)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := F32ToF16(got); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

// refNearestF16 rounds f to the nearest half by search over all finite
// positive halves (ties to the even bit pattern), independent of F32ToF16.
// vals[h] is the value of half h for h = 0..0x7bff; vals[0x7c00] is 65536,
// the next step past the largest half: IEEE rounds as if the exponent were
// unbounded, and whatever rounds to that step is infinity (0x7c00).
type halfTable struct{ vals []float64 }

func newHalfTable() *halfTable {
	ht := &halfTable{vals: make([]float64, 0x7c01)}
	for h := range 0x7c00 {
		ht.vals[h] = refHalf(uint16(h))
	}
	ht.vals[0x7c00] = 65536
	return ht
}

func (ht *halfTable) nearest(f float32) uint16 {
	x := math.Abs(float64(f))
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	vals := ht.vals
	i := sort.SearchFloat64s(vals, x) // first vals[i] >= x
	if i == len(vals) {
		return sign | 0x7c00
	}
	if vals[i] == x || i == 0 {
		return sign | uint16(i)
	}
	lo, hi := vals[i-1], vals[i]
	var h int
	switch {
	case x-lo < hi-x:
		h = i - 1
	case x-lo > hi-x:
		h = i
	case (i-1)%2 == 0:
		h = i - 1
	default:
		h = i
	}
	return sign | uint16(h)
}

func TestF32ToF16Rounding(t *testing.T) {
	ht := newHalfTable()
	check := func(f float32) {
		t.Helper()
		got := F32ToF16(f)
		if want := ht.nearest(f); got != want {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
		if g := ggmlFP32ToFP16(f); got != g {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, ggml gives %#04x", f, math.Float32bits(f), got, g)
		}
	}
	// Midpoints between neighbouring halves and the floats either side of
	// them: ties go to the even pattern, anything else to the nearer half.
	for h := range 0x7bff {
		a, b := float64(F16ToF32(uint16(h))), float64(F16ToF32(uint16(h+1)))
		mid := float32((a + b) / 2) // exact: a half-ulp needs 12 bits
		if float64(mid) != (a+b)/2 {
			t.Fatalf("midpoint of %#04x not exact in float32", h)
		}
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9)} {
			check(f)
			check(-f)
		}
		even := uint16(h)
		if h%2 == 1 {
			even++
		}
		if got := F32ToF16(mid); got != even {
			t.Fatalf("tie %g: got %#04x, want even %#04x", mid, got, even)
		}
	}
	// Edges: overflow threshold, underflow threshold, specials.
	edges := []float32{0, 65504, 65519.996, 65520, 65536, 1e10, math.MaxFloat32,
		float32(math.Inf(1)), 0x1p-24, 0x1p-25, math.Nextafter32(0x1p-25, 1), 0x1p-26,
		0x1p-14, math.Nextafter32(0x1p-14, 0), 1e-45, 0x1.ffcp-15}
	for _, f := range edges {
		check(f)
		check(-f)
	}
	if got := F32ToF16(65520); got != 0x7c00 {
		t.Errorf("F32ToF16(65520) = %#04x, want +inf", got)
	}
	if got := F32ToF16(math.Nextafter32(65520, 0)); got != 0x7bff {
		t.Errorf("F32ToF16(just below 65520) = %#04x, want 65504", got)
	}
	if got := F32ToF16(0x1p-25); got != 0 {
		t.Errorf("F32ToF16(2^-25) = %#04x, want 0 (tie to even)", got)
	}
	if got := F32ToF16(math.Nextafter32(0x1p-25, 1)); got != 1 {
		t.Errorf("F32ToF16(just above 2^-25) = %#04x, want 1", got)
	}
	if got := F32ToF16(float32(math.NaN())); got&0x7fff != 0x7e00 {
		t.Errorf("F32ToF16(NaN) = %#04x, want quiet NaN 0x7e00", got)
	}
	// Random float32s across the whole range of exponents.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		b := rng.Uint32()
		f := math.Float32frombits(b)
		if isNaN32(f) {
			continue
		}
		check(f)
		// And concentrated where halves live.
		check(math.Float32frombits(0x33000000 + b%(0x47800000-0x33000000)))
	}
}

func refBF16(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }

func TestBF16Exhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		got := BF16ToF32(h)
		isNaN := h&0x7f80 == 0x7f80 && h&0x7f != 0
		if isNaN {
			back := F32ToBF16(got)
			if back != h|0x40 {
				t.Fatalf("F32ToBF16(NaN %#04x) = %#04x, want %#04x (quieted)", h, back, h|0x40)
			}
			continue
		}
		if back := F32ToBF16(got); back != h {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

func TestF32ToBF16Rounding(t *testing.T) {
	// Reference: pick the nearer of the two bfloat16 neighbours of |f| in
	// float64 (ties to even), with 0x7f80 standing for 2^128 when rounding up
	// past the largest finite value.
	ref := func(f float32) uint16 {
		b := math.Float32bits(f)
		sign := uint16(b>>16) & 0x8000
		abs := b & 0x7fffffff
		lo := uint16(abs >> 16)
		if abs&0xffff == 0 {
			return sign | lo
		}
		hi := lo + 1
		loV := refBF16(lo)
		hiV := refBF16(hi)
		if hi == 0x7f80 {
			hiV = math.Pow(2, 128)
		}
		x := float64(math.Float32frombits(abs))
		switch {
		case x-loV < hiV-x:
			return sign | lo
		case x-loV > hiV-x:
			return sign | hi
		case lo%2 == 0:
			return sign | lo
		}
		return sign | hi
	}
	rng := rand.New(rand.NewPCG(3, 4))
	cases := []uint32{0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x7f7fffff, 0x7f7f8000, 0x7f7f7fff,
		0x00008000, 0x00018000, 0x80008000, 0x7f800000, 0xff800000, 0}
	for range 1 << 20 {
		cases = append(cases[:13], rng.Uint32())
		for _, b := range cases {
			f := math.Float32frombits(b)
			if isNaN32(f) {
				if got := F32ToBF16(f); got&0x7f80 != 0x7f80 || got&0x40 == 0 {
					t.Fatalf("F32ToBF16(NaN %#08x) = %#04x, want quiet NaN", b, got)
				}
				continue
			}
			if got, want := F32ToBF16(f), ref(f); got != want {
				t.Fatalf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", f, b, got, want)
			}
		}
	}
}

func TestSliceConversions(t *testing.T) {
	src := []float32{0, 1, -2.5, 65504, 1e-7, 3.14159}
	h := make([]uint16, len(src))
	F32ToF16Slice(h, src)
	back := make([]float32, len(src))
	F16ToF32Slice(back, h)
	for i, f := range src {
		if h[i] != F32ToF16(f) || back[i] != F16ToF32(h[i]) {
			t.Errorf("F16 slice element %d: %#04x %v", i, h[i], back[i])
		}
	}
	F32ToBF16Slice(h, src)
	BF16ToF32Slice(back, h)
	for i, f := range src {
		if h[i] != F32ToBF16(f) || back[i] != BF16ToF32(h[i]) {
			t.Errorf("BF16 slice element %d: %#04x %v", i, h[i], back[i])
		}
	}
}
