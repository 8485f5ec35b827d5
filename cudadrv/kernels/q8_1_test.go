package kernels

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
)

// TestQ8_1Host checks the host twin of the GPU's Q8_1 activations on the
// CPU: its first plane is ggml's Q8_1 rounding (ops, with d kept in
// float32), and the two planes together hold each value to within a
// 254th of its block's second-plane step.
func TestQ8_1Host(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const nTok, cols = 3, 256
	x := make([]float32, nTok*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(5)-2)))
	}
	clear(x[64:96]) // an all-zero block
	one, err := Q8_1Host(x, nTok, cols, 1)
	if err != nil {
		t.Fatal(err)
	}
	two, err := Q8_1Host(x, nTok, cols, 2)
	if err != nil {
		t.Fatal(err)
	}
	n := nTok * cols
	ref := make([]byte, cols/32*36)
	for tk := range nTok {
		if err := ops.Quantize(gguf.TypeQ8_1, ref, x[tk*cols:(tk+1)*cols]); err != nil {
			t.Fatal(err)
		}
		for b := range cols / 32 {
			gb := tk*cols/32 + b
			if d := math.Float32frombits(binary.LittleEndian.Uint32(one[align16(n)+8*gb:])); ops.F32ToF16(d) != binary.LittleEndian.Uint16(ref[36*b:]) {
				t.Fatalf("token %d block %d: d %v, ops has f16 %#x", tk, b, d, binary.LittleEndian.Uint16(ref[36*b:]))
			}
			for j := range 32 {
				if one[gb*32+j] != ref[36*b+4+j] {
					t.Fatalf("token %d value %d: q %d, ops has %d", tk, 32*b+j, int8(one[gb*32+j]), int8(ref[36*b+4+j]))
				}
			}
		}
	}
	for i := range n {
		if two[i] != one[i] {
			t.Fatalf("value %d: the first of two planes %d, one plane %d", i, int8(two[i]), int8(one[i]))
		}
	}
	ds1, ds2 := one[align16(n):], two[align16(2*n):]
	for b := range n / 32 {
		if !bytes.Equal(ds1[8*b:8*b+8], ds2[8*b:8*b+8]) {
			t.Fatalf("block %d: the first plane's scales differ", b)
		}
		d1 := math.Float32frombits(binary.LittleEndian.Uint32(ds2[8*b:]))
		d2 := math.Float32frombits(binary.LittleEndian.Uint32(ds2[8*(n/32+b):]))
		if d2 > d1/2/127*1.0001 {
			t.Errorf("block %d: second plane's step %v, over half of the first's (%v) / 127", b, d2, d1)
		}
		for j := range 32 {
			i := 32*b + j
			v := float64(d1)*float64(int8(two[i])) + float64(d2)*float64(int8(two[n+i]))
			if e := math.Abs(v - float64(x[i])); e > float64(d2)/2*1.0001+1e-30 {
				t.Fatalf("value %d: two planes hold %v for %v (error %v, step %v)", i, v, x[i], e, d2)
			}
		}
	}
	if _, err := Q8_1Host(x, nTok, cols, 3); err == nil {
		t.Error("three planes taken")
	}
	if _, err := Q8_1Host(x[:10], 1, 10, 1); err == nil {
		t.Error("10 columns taken")
	}
	if msg := Q8_1Compare(two, two, nTok, cols, 2); msg != "" {
		t.Errorf("a buffer against itself: %s", msg)
	}
	bad := bytes.Clone(two)
	bad[n+5]++
	if msg := Q8_1Compare(bad, two, nTok, cols, 2); msg == "" {
		t.Error("a changed second plane compared equal")
	}
}
