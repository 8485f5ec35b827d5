package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

var packTypes = []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K}

// packCase is a matrix of whole groups plus tail rows, its repacked groups
// and tokens of activations, all in misaligned buffers.
type packCase struct {
	*kernelCase
	f      *packFormat
	nb     int
	packed []byte // the whole groups, repacked
	groups int
}

func newPackCase(typ gguf.Type, n, rows, nTok int, realistic bool, off int, rng *rand.Rand) *packCase {
	c := &packCase{kernelCase: newKernelCase(typ, n, rows, nTok, realistic, off, rng), f: packFormats[typ]}
	c.nb = n / qkK
	c.groups = rows / packRows
	gb := c.nb * c.f.blockBytes
	p := make([]byte, c.groups*gb)
	for g := range c.groups {
		c.f.pack(p[g*gb:(g+1)*gb], c.w[g*packRows*c.rb:(g+1)*packRows*c.rb], c.rb, c.nb)
	}
	c.packed = misaligned(p, (off*3)%64)
	return c
}

// runPacked computes the whole groups with mul into an output whose rows
// (tokens) are wider than the groups, guards all around; it returns the
// outputs [nTok][groups*16].
func (c *packCase) runPacked(t *testing.T, mul packedMulFunc) []float32 {
	rows := c.groups * packRows
	ld := rows + 5
	const pad = 16
	buf := make([]float32, pad+c.nTok*ld+pad)
	for i := range buf {
		buf[i] = guard
	}
	mul(c.nb, c.packed, c.groups, c.xq, c.ab, c.nTok, buf[pad:pad+(c.nTok-1)*ld+rows], ld)
	got := make([]float32, c.nTok*rows)
	for i, v := range buf {
		j := i - pad
		tok, r := j/ld, j%ld
		if j >= 0 && tok < c.nTok && r < rows {
			got[tok*rows+r] = v
		} else if !isGuard(v) {
			t.Fatalf("%s: buffer index %d (token %d, column %d) was written", c.typ, j, tok, r)
		}
	}
	return got
}

// TestPackedTwinMatchesGeneric: the pure-Go products over repacked weights
// agree with the original generic dot products within float rounding.
func TestPackedTwinMatchesGeneric(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 81))
	for _, typ := range packTypes {
		for _, nb := range []int{1, 3, 7} {
			for _, realistic := range []bool{false, true} {
				rows := packRows * (1 + rng.IntN(2))
				c := newPackCase(typ, nb*qkK, rows, 1+rng.IntN(4), realistic, rng.IntN(64), rng)
				want, tol := c.want()
				got := c.runPacked(t, c.f.twin)
				for i := range want {
					if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol[i]) {
						t.Fatalf("%s nb=%d realistic=%v: token %d row %d = %g, generic %g (diff %g > %g)",
							typ, nb, realistic, i/rows, i%rows, got[i], want[i], d, tol[i])
					}
				}
			}
		}
	}
}

// TestPackLayout checks the repacked fields against the original blocks
// element by element (the layout comment in repack.go).
func TestPackLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 82))
	for _, typ := range packTypes {
		c := newPackCase(typ, 2*qkK, packRows, 1, false, 0, rng)
		deq := make([]float32, 2*qkK)
		for r := range packRows {
			if err := DequantizeRow(typ, deq, c.w[r*c.rb:(r+1)*c.rb]); err != nil {
				t.Fatal(err)
			}
			for b := range 2 {
				o := c.packed[b*c.f.blockBytes:]
				for e := range qkK {
					var got float32
					pc, l := e/64, e%64
					k, i, nib := l%32/4, l%4, uint(4*(l/32))
					lo := o[512*pc+64*k+4*r+i] >> nib & 0xf
					switch typ {
					case gguf.TypeQ4_K:
						j := e / 32
						var packedScales [12]byte
						for i := range packedScales {
							packedScales[i] = o[2048+16*i+r]
						}
						sc, m := unpackScalesK4(packedScales[:])
						d, dmin := getF16(o[2240+2*r:]), getF16(o[2272+2*r:])
						got = d*float32(sc[j])*float32(lo) - dmin*float32(m[j])
					case gguf.TypeQ6_K:
						j, a := e/16, e%16/4
						hi := o[2048+64*j+4*r+i] >> (2 * a) & 3
						sc := int8(o[3072+32*(j/2)+2*r+j%2])
						got = getF16(o[3328+2*r:]) * float32(sc) * float32(int32(lo|hi<<4)-32)
					}
					if want := deq[b*qkK+e]; math.Abs(float64(got-want)) > 1e-6*math.Abs(float64(want))+1e-30 {
						t.Fatalf("%s row %d block %d element %d: repacked %g, original %g", typ, r, b, e, got, want)
					}
				}
			}
		}
	}
}

// withPackedKernels runs f with the packed products of each type replaced
// (the twins, where the level has none), restoring them after.
func withPackedKernels(t testing.TB, kernels map[gguf.Type]packedMulFunc, f func()) {
	saved := map[gguf.Type]packedMulFunc{}
	for k, v := range packedMul {
		saved[k] = v
	}
	defer func() {
		clear(packedMul)
		for k, v := range saved {
			packedMul[k] = v
		}
	}()
	clear(packedMul)
	for k, v := range kernels {
		packedMul[k] = v
	}
	f()
}

// packedKernelsOrTwins is the active level's packed products, the twins
// for types it has none of.
func packedKernelsOrTwins() map[gguf.Type]packedMulFunc {
	m := map[gguf.Type]packedMulFunc{}
	for typ, f := range packFormats {
		m[typ] = f.twin
		if k := packedMul[typ]; k != nil {
			m[typ] = k
		}
	}
	return m
}

// TestRepackedMatrix: Mul, MulQ and MulQGroup of repacked matrices (whole
// groups and tail rows, one and several tokens, a slice of a stack) agree
// with the original matrices within float rounding, and each token's
// result is the same bits whether computed alone or with others.
func TestRepackedMatrix(t *testing.T) {
	withPackedKernels(t, packedKernelsOrTwins(), func() {
		rng := rand.New(rand.NewPCG(7, 83))
		pool := NewPool(3)
		defer pool.Close()
		for _, typ := range packTypes {
			k, _ := KernelFor(typ)
			n := 3 * qkK
			var ms, rs []Matrix
			for _, rows := range []int{16, 35, 64} {
				data := make([]byte, 0, rows*k.RowBytes(n))
				for range rows {
					data = append(data, randomRow(typ, n, rng)...)
				}
				m, err := NewMatrix(k, rows, n, data)
				if err != nil {
					t.Fatal(err)
				}
				size := m.RepackSize()
				r, ok := m.Repack()
				if !ok {
					t.Fatalf("%s: Repack refused with packed kernels set", typ)
				}
				if r.RepackedBytes() != size || r.RepackSize() != size {
					t.Fatalf("%s %d rows: RepackSize %d before, %d after, the copy %d", typ, rows, size, r.RepackSize(), r.RepackedBytes())
				}
				if u := r.Unpacked(); u.RepackedBytes() != 0 || u.RepackSize() != size || len(u.Data) != len(m.Data) {
					t.Fatalf("%s %d rows: Unpacked kept a copy or changed the blocks", typ, rows)
				}
				if want := rows / packRows * (n / qkK) * packFormats[typ].blockBytes; r.RepackedBytes() != want {
					t.Fatalf("%s %d rows: RepackedBytes %d, want %d", typ, rows, r.RepackedBytes(), want)
				}
				if m.RepackedBytes() != 0 {
					t.Fatalf("Repack changed its receiver")
				}
				ms, rs = append(ms, m), append(rs, r)
			}
			// An expert-like slice: whole groups, then a slice off a group boundary.
			ms, rs = append(ms, ms[2].Slice(16, 48), ms[2].Slice(8, 40)), append(rs, rs[2].Slice(16, 48), rs[2].Slice(8, 40))
			if rs[3].RepackedBytes() == 0 || rs[4].RepackedBytes() != 0 {
				t.Fatalf("%s: slices kept %d and %d repacked bytes", typ, rs[3].RepackedBytes(), rs[4].RepackedBytes())
			}
			for _, nTok := range []int{1, 2, 5, 13, 35} {
				x := gaussRow(nTok*n, rng)
				for i := range ms {
					want := make([]float32, nTok*ms[i].Rows)
					got := make([]float32, nTok*ms[i].Rows)
					ms[i].Mul(pool, x, nTok, want, ms[i].Rows, make([]byte, ms[i].ActBytes(nTok)))
					rs[i].Mul(pool, x, nTok, got, rs[i].Rows, make([]byte, rs[i].ActBytes(nTok)))
					what := fmt.Sprintf("%s matrix %d (%d rows) nTok=%d", typ, i, ms[i].Rows, nTok)
					comparePacked(t, what, got, want)
					alone := make([]float32, rs[i].Rows)
					for tok := range nTok {
						rs[i].Mul(pool, x[tok*n:(tok+1)*n], 1, alone, rs[i].Rows, make([]byte, rs[i].ActBytes(1)))
						for r, v := range alone {
							if math.Float32bits(v) != math.Float32bits(got[tok*rs[i].Rows+r]) {
								t.Fatalf("%s: token %d row %d: %g alone, %g with the others", what, tok, r, v, got[tok*rs[i].Rows+r])
							}
						}
					}
				}
				// The group: outputs of several widths, a mix of repacked and not.
				xq := ms[0].QuantizeActs(pool, x, nTok, make([]byte, ms[0].ActBytes(nTok)))
				group := []Matrix{rs[1], ms[0], rs[2], rs[3]}
				outs, wants := make([][]float32, len(group)), make([][]float32, len(group))
				lds := make([]int, len(group))
				for i, m := range group {
					lds[i] = m.Rows + i
					outs[i] = make([]float32, nTok*lds[i])
					wants[i] = make([]float32, nTok*lds[i])
					m2 := m
					m2.packed = nil
					m2.MulQ(pool, xq, nTok, wants[i], lds[i])
				}
				MulQGroup(pool, group, xq, nTok, outs, lds)
				for i := range group {
					comparePacked(t, fmt.Sprintf("%s group member %d nTok=%d", typ, i, nTok), outs[i], wants[i])
				}
			}
		}
	})
}

// TestMulRowsMatchesMulQ: rows computed by MulRows over any split into
// whole groups (the last one ragged) are MulQ's, bit for bit, for repacked
// matrices (whole groups and tail rows) and plain ones of other types.
func TestMulRowsMatchesMulQ(t *testing.T) {
	withPackedKernels(t, packedKernelsOrTwins(), func() {
		rng := rand.New(rand.NewPCG(7, 84))
		for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeF16} {
			k, _ := KernelFor(typ)
			n, rows := 2*qkK, 5*RowGroup+7
			data := make([]byte, 0, rows*k.RowBytes(n))
			for range rows {
				data = append(data, randomRow(typ, n, rng)...)
			}
			m, err := NewMatrix(k, rows, n, data)
			if err != nil {
				t.Fatal(err)
			}
			ms := []Matrix{m}
			if r, ok := m.Repack(); ok {
				ms = append(ms, r)
			}
			for _, m := range ms {
				for _, nTok := range []int{1, 3} {
					xq := m.QuantizeActs(nil, gaussRow(nTok*n, rng), nTok, make([]byte, m.ActBytes(nTok)))
					ld := rows + 2
					want, got := make([]float32, nTok*ld), make([]float32, nTok*ld)
					m.MulQ(nil, xq, nTok, want, ld)
					for lo := 0; lo < rows; {
						hi := min(rows, lo+RowGroup*(1+rng.IntN(3)))
						m.MulRows(lo, hi, xq, nTok, got, ld)
						lo = hi
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s (repacked %v) nTok=%d: output %d = %g by rows, %g by MulQ", typ, m.RepackedBytes() > 0, nTok, i, got[i], want[i])
						}
					}
				}
			}
		}
	})
}

// comparePacked checks got against the original kernels' want, within a
// relative 1e-5 of the larger outputs (the rounding of two summation
// orders).
func comparePacked(t *testing.T, what string, got, want []float32) {
	t.Helper()
	var scale float64
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		if !(math.Abs(float64(got[i]-want[i])) <= 1e-5*scale) {
			t.Fatalf("%s: output %d = %g, original %g", what, i, got[i], want[i])
		}
	}
}

// TestRepackRefused: types without packed kernels, too few rows, or a level
// without them leave the matrix as it is.
func TestRepackRefused(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 84))
	k, _ := KernelFor(gguf.TypeQ8_0)
	data := make([]byte, 0, 16*k.RowBytes(256))
	for range 16 {
		data = append(data, randomRow(gguf.TypeQ8_0, 256, rng)...)
	}
	m, _ := NewMatrix(k, 16, 256, data)
	if _, ok := m.Repack(); ok || m.RepackSize() != 0 {
		t.Error("Q8_0 repacked")
	}
	k4, _ := KernelFor(gguf.TypeQ4_K)
	withPackedKernels(t, packedKernelsOrTwins(), func() {
		m4, _ := NewMatrix(k4, 15, 256, make([]byte, 15*k4.RowBytes(256)))
		if _, ok := m4.Repack(); ok || m4.RepackSize() != 0 {
			t.Error("15 rows repacked")
		}
	})
	withPackedKernels(t, nil, func() {
		m4, _ := NewMatrix(k4, 16, 256, make([]byte, 16*k4.RowBytes(256)))
		if r, ok := m4.Repack(); ok || r.RepackedBytes() != 0 || m4.RepackSize() != 0 {
			t.Error("repacked without packed kernels")
		}
	})
}

// TestPackedKernelsMatchTwin: every level's packed kernels against the
// pure-Go twin (the same integers and float steps: equal but for the twin's
// rare double rounding) and against the original generic dot products
// (within float rounding), over odd block counts, token counts that use
// every token grouping, several groups, misaligned buffers, guards.
func TestPackedKernelsMatchTwin(t *testing.T) {
	for _, l := range SupportedLevels() {
		for _, typ := range packTypes {
			mul := archPacked(l, typ)
			if mul == nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", l, typ), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(l), 85))
				differ, total := 0, 0
				for _, nb := range []int{1, 2, 5, 17} {
					for _, realistic := range []bool{false, true} {
						nTok := 1 + rng.IntN(15)
						if realistic {
							nTok = 16 + rng.IntN(24) // the 16-token kernels and a tail
						}
						groups := 1 + rng.IntN(3)
						c := newPackCase(typ, nb*qkK, groups*packRows, nTok, realistic, rng.IntN(64), rng)
						twin := c.runPacked(t, c.f.twin)
						got := c.runPacked(t, mul)
						var want, tol []float64
						if nb <= 5 { // the float64 reference is slow; the twin is checked against it too
							want, tol = c.want()
						}
						for i := range got {
							total++
							if math.Float32bits(got[i]) != math.Float32bits(twin[i]) {
								differ++
								if d := math.Abs(float64(got[i] - twin[i])); d > 1e-6*math.Abs(float64(twin[i])) {
									t.Fatalf("nb=%d nTok=%d groups=%d realistic=%v: token %d row %d = %g, twin %g",
										nb, nTok, groups, realistic, i/c.rows, i%c.rows, got[i], twin[i])
								}
							}
							if want == nil {
								continue
							}
							if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol[i]) {
								t.Fatalf("nb=%d nTok=%d: token %d row %d = %g, generic %g (diff %g > %g)",
									nb, nTok, i/c.rows, i%c.rows, got[i], want[i], d, tol[i])
							}
						}
					}
				}
				t.Logf("%d of %d outputs differ from the twin in the last bits", differ, total)
			})
		}
	}
}

// TestRepackParallel: a matrix large enough to be repacked by several
// goroutines gives the same bytes as packing group by group.
func TestRepackParallel(t *testing.T) {
	k, _ := KernelFor(gguf.TypeQ4_K)
	const rows, n = 8192 + 16 + 5, 4096
	data := make([]byte, rows*k.RowBytes(n))
	rng := rand.New(rand.NewPCG(9, 86))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	m, _ := NewMatrix(k, rows, n, data)
	withPackedKernels(t, packedKernelsOrTwins(), func() {
		r, ok := m.Repack()
		if !ok {
			t.Fatal("not repacked")
		}
		nb, rb := n/qkK, k.RowBytes(n)
		gb := nb * packQ4KBytes
		want := make([]byte, gb)
		for g := range rows / packRows {
			packQ4K(want, data[g*packRows*rb:], rb, nb)
			if string(r.packed.data[g*gb:(g+1)*gb]) != string(want) {
				t.Fatalf("group %d differs", g)
			}
		}
	})
}
