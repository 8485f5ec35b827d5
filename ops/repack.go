package ops

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/atsinfer/ats/gguf"
)

// Repacked weights: a copy of a Q4_K or Q6_K matrix in which packRows
// consecutive rows are interleaved block by block, prepared once at load
// (as llama.cpp's CPU "repack" buffers are). A 512-bit vector then holds
// four consecutive weights of each of 16 rows, so one activation dword,
// broadcast, is dotted with 16 rows by one VPDPBUSD, the per-row sums stay
// in the lanes (no horizontal sums), and each block's scales and mins are
// unpacked once for 16 rows and up to 16 tokens. The copy is host memory
// on top of the mapped file, whose original blocks the GPU, Row and
// DequantizeRow keep using (Matrix.RepackedBytes).
//
// A group-block is packRows rows × one 256-element super-block. Layouts
// (all offsets in bytes, r = row within the group, 0..15):
//
//	Q4_K, 2304 bytes (144 per row-block, as the original):
//	  [0, 2048)     qs: piece g (0..3), quad k (0..7) at 512g + 64k, row r
//	                at +4r: the original row's qs[32g+4k : 32g+4k+4], whose
//	                low nibbles are elements 64g+4k+i (sub-block 2g) and
//	                high nibbles elements 64g+32+4k+i (sub-block 2g+1)
//	  [2048, 2240)  scales[12][16]: byte b of row r's packed 6-bit scales
//	                and mins at 16b+r (the kernels unpack them for 16 rows
//	                at once)
//	  [2240, 2272)  d[16] f16;  [2272, 2304) dmin[16] f16
//
//	Q6_K, 3360 bytes (210 per row-block, as the original):
//	  [0, 2048)     ql: as Q4_K's qs, the low 4 bits of elements 64g+4k+i
//	                (low nibble) and 64g+32+4k+i (high nibble)
//	  [2048, 3072)  qh: scale group j (elements 16j..16j+15) at 2048+64j,
//	                row r at +4r: byte i holds the high 2 bits of element
//	                16j+4a+i in bits 2a, 2a+1 (a = 0..3)
//	  [3072, 3328)  sc pairs: pair p at 3072+32p, row r at +2r: the int8
//	                scales of groups 2p and 2p+1
//	  [3328, 3360)  d[16] f16
//
// Rows beyond the last whole group (Rows%16) are not repacked; the products
// compute them from the original blocks.
//
// Every product of a repacked matrix reads the copy, one token (decode) as
// well as many: a token's result must not depend on how many tokens it is
// computed with (a prompt continued from the cache must give what a fresh
// prompt gives), and the packed kernels compute each token the same way
// whatever their token count, but not the way the original kernels do. The
// original blocks are then no longer read (their mapped pages can be
// dropped by the OS), and the copy has their size.
const packRows = 16

const (
	packQ4KBytes = 2304
	packQ6KBytes = 3360
)

// packFormat is one weight type's repacked layout.
type packFormat struct {
	blockBytes int // bytes of one group-block
	// pack writes the group-blocks of packRows rows of nb blocks each
	// (src: the rows, rb bytes apart) into dst (nb·blockBytes).
	pack func(dst, src []byte, rb, nb int)
	// twin is the pure-Go product over the repacked layout: the reference
	// of the assembly (see packedMulFunc).
	twin packedMulFunc
}

// packedMulFunc computes out[t*ldOut + 16g + r] = row 16g+r · token t for
// the groups g < groups of repacked weights w (nb group-blocks per group,
// groups back to back) and tokens t < nTok of Q8_K activations ab bytes
// apart in x.
type packedMulFunc func(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int)

var packFormats = map[gguf.Type]*packFormat{
	gguf.TypeQ4_K: {blockBytes: packQ4KBytes, pack: packQ4K, twin: mulPackedQ4K},
	gguf.TypeQ6_K: {blockBytes: packQ6KBytes, pack: packQ6K, twin: mulPackedQ6K},
}

// packedMul is the active level's product over repacked weights of each
// type (set by SetCPULevel); a type is absent where the level has no such
// kernel, and a repacked matrix then computes from its original blocks.
var packedMul = map[gguf.Type]packedMulFunc{}

func setPackedLevel(l Level) {
	clear(packedMul)
	for t := range packFormats {
		if f := archPacked(l, t); f != nil {
			packedMul[t] = f
		}
	}
}

// packedCopy is a matrix's repacked copy: groups whole groups of packRows rows.
type packedCopy struct {
	data   []byte
	groups int
	format *packFormat
}

// Repack returns m with a repacked copy of its whole groups of 16 rows,
// which its products (Mul, MulQ, MulQGroup, any token count) then read
// instead of m.Data (see the layouts above); Row, DequantizeRow and the GPU
// keep using m.Data, which is not modified. ok is false, and m is returned
// unchanged, when the active CPU level has no kernels for repacked weights
// of m's type (only Q4_K and Q6_K have them, on the amd64 levels) or m has
// fewer than 16 rows; a matrix already repacked is returned as it is, with
// ok true. The copy is RepackedBytes long (the size of the rows it
// covers), allocated on the Go heap and freed with the last Matrix that
// holds it. A large matrix is repacked by up to GOMAXPROCS goroutines;
// Repack may also run concurrently for different matrices.
func (m Matrix) Repack() (Matrix, bool) {
	f := packFormats[m.Kernel.Type]
	if f == nil || packedMul[m.Kernel.Type] == nil || m.Rows < packRows || m.packed != nil {
		return m, m.packed != nil
	}
	nb := m.Cols / m.Kernel.BlockSize
	rb := m.Kernel.RowBytes(m.Cols)
	groups := m.Rows / packRows
	gb := nb * f.blockBytes
	data := make([]byte, groups*gb)
	// A large matrix is repacked by several goroutines (about 1.5-3 GB/s
	// each): loading a 14B model repacks gigabytes.
	pack := func(g0, g1 int) {
		for g := g0; g < g1; g++ {
			f.pack(data[g*gb:(g+1)*gb], m.Data[g*packRows*rb:(g+1)*packRows*rb], rb, nb)
		}
	}
	if workers := min(runtime.GOMAXPROCS(0), len(data)/(16<<20)); workers > 1 {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { pack(w*groups/workers, (w+1)*groups/workers) })
		}
		wg.Wait()
	} else {
		pack(0, groups)
	}
	m.packed = &packedCopy{data: data, groups: groups, format: f}
	return m, true
}

// RepackedBytes is the size of m's repacked copy (0 without one): the host
// memory Repack added.
func (m Matrix) RepackedBytes() int {
	if m.packed == nil {
		return 0
	}
	return len(m.packed.data)
}

// RepackSize is the size of the copy Repack would make of m now: 0 when it
// would refuse (no repacked layout or kernels for m's type at the active
// level, fewer than 16 rows); for a matrix already repacked, its copy's
// size (RepackedBytes).
func (m Matrix) RepackSize() int {
	if m.packed != nil {
		return len(m.packed.data)
	}
	f := packFormats[m.Kernel.Type]
	if f == nil || packedMul[m.Kernel.Type] == nil || m.Rows < packRows {
		return 0
	}
	return m.Rows / packRows * (m.Cols / m.Kernel.BlockSize) * f.blockBytes
}

// Unpacked is m without its repacked copy: its products read the
// original blocks (m itself when it has no copy).
func (m Matrix) Unpacked() Matrix {
	m.packed = nil
	return m
}

// usePacked reports whether m's products read its repacked copy: it has
// one and the active level has kernels for it.
func (m Matrix) usePacked() bool {
	return m.packed != nil && packedMul[m.Kernel.Type] != nil
}

// slicePacked is the repacked copy of rows [lo, hi) of m, when lo is a
// group boundary: the whole groups inside the range.
func (m Matrix) slicePacked(lo, hi int) *packedCopy {
	p := m.packed
	if p == nil || lo%packRows != 0 {
		return nil
	}
	g0, g1 := lo/packRows, min(hi/packRows, p.groups)
	if g1 <= g0 {
		return nil
	}
	gb := len(p.data) / p.groups
	return &packedCopy{data: p.data[g0*gb : g1*gb], groups: g1 - g0, format: p.format}
}

// mulPackedGroup is MulQGroup (and MulQ, with one matrix) when some of ms
// are repacked: the work is split in units of 16 rows of one matrix, a
// repacked group computed by the level's packed kernel, other rows by the
// row kernel.
func mulPackedGroup(p *Pool, ms []Matrix, xqs [][]byte, nTok int, outs [][]float32, ldOuts []int) {
	units := 0
	for _, m := range ms {
		units += (m.Rows + packRows - 1) / packRows
	}
	// The smallest chunk is about what the row kernels take (chunkRows),
	// in whole groups; RunChunks starts bigger.
	minUnits := max(1, chunkRows(ms[0].Kernel.RowBytes(ms[0].Cols), nTok)/packRows)
	p.RunChunks(units, minUnits, func(lo, hi int) {
		base := 0
		for i, m := range ms {
			mu := (m.Rows + packRows - 1) / packRows
			a, b := max(lo-base, 0), min(hi-base, mu)
			base += mu
			if a >= b {
				continue
			}
			m.MulRows(a*packRows, min(b*packRows, m.Rows), xqs[i], nTok, outs[i], ldOuts[i])
		}
	})
}

// ---- Q4_K

// packQ4K interleaves 16 Q4_K rows (see the layout above).
func packQ4K(dst, src []byte, rb, nb int) {
	for b := range nb {
		o := dst[b*packQ4KBytes:][:packQ4KBytes]
		for r := range packRows {
			blk := src[r*rb+b*blockQ4_K:][:blockQ4_K]
			for i := range 12 {
				o[2048+16*i+r] = blk[4+i]
			}
			copy(o[2240+2*r:][:2], blk[0:2])
			copy(o[2272+2*r:][:2], blk[2:4])
			qs := blk[16:][:128]
			for q := range 32 { // the word of piece q/8, quad q%8
				binary.LittleEndian.PutUint32(o[64*q+4*r:], binary.LittleEndian.Uint32(qs[4*q:]))
			}
		}
	}
}

// fmaF32 is a·b + c rounded once to float32, as VFMADD computes it (through
// float64, which is exact for the product; the sum can round twice in rare
// cases, an ulp apart).
func fmaF32(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}

// mulPackedQ4K is the reference of the repacked Q4_K kernels. For each row
// and token, per block: the exact integer sums
//
//	iacc = Σ_j sc_j · Σ_{i in sub-block j} q_i·x_i
//	macc = Σ_j m_j · (bsum_2j + bsum_2j+1)
//
// then f = float(iacc)·d, f −= float(macc)·dmin (fused), acc += f·yd
// (fused), in block order. The assembly computes the same integers (in
// another order: integer addition is exact) and the same float steps, so
// it matches this twin but for the rare double rounding of fmaF32. The
// original kernels (dotQ4_K) sum eight or sixteen lanes instead of one, so
// the two agree to float rounding, not bit for bit.
func mulPackedQ4K(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
	gb := nb * packQ4KBytes
	for g := range groups {
		wg := w[g*gb:][:gb]
		for t := range nTok {
			var acc [packRows]float32
			for b := range nb {
				o := wg[b*packQ4KBytes:][:packQ4KBytes]
				yd, q8, bsums := q8K(x[t*ab+b*blockQ8_K:])
				for r := range packRows {
					var packedScales [12]byte
					for i := range packedScales {
						packedScales[i] = o[2048+16*i+r]
					}
					sc, m := unpackScalesK4(packedScales[:])
					var iacc, macc int32
					for j := range 8 {
						pc, nib := j/2, uint(4*(j%2))
						var s int32
						for k := range 8 {
							for i := range 4 {
								q := int32(o[512*pc+64*k+4*r+i] >> nib & 0xf)
								s += q * int32(int8(q8[64*pc+32*(j%2)+4*k+i]))
							}
						}
						iacc += int32(sc[j]) * s
						macc += int32(m[j]) * (bsum(bsums, 2*j) + bsum(bsums, 2*j+1))
					}
					d := f16Table[binary.LittleEndian.Uint16(o[2240+2*r:])]
					dmin := f16Table[binary.LittleEndian.Uint16(o[2272+2*r:])]
					f := float32(iacc) * d
					f = fmaF32(-float32(macc), dmin, f)
					acc[r] = fmaF32(f, yd, acc[r])
				}
			}
			copy(out[t*ldOut+g*packRows:][:packRows], acc[:])
		}
	}
}

// ---- Q6_K

// packQ6K interleaves 16 Q6_K rows (see the layout above), four elements
// (one 32-bit word of each field) at a time. In the original block, element
// 64g+l (l < 64) has its low 4 bits in ql[64(g/2) + l] (the high nibble
// when g is odd) and its high 2 bits in qh[32(g/2) + l%32], bits
// 2(2(g%2) + l/32).
func packQ6K(dst, src []byte, rb, nb int) {
	const lo4, lo2 = 0x0f0f0f0f, 0x03030303
	le := binary.LittleEndian
	for b := range nb {
		o := dst[b*packQ6KBytes:][:packQ6KBytes]
		for r := range packRows {
			blk := src[r*rb+b*blockQ6_K:][:blockQ6_K]
			for g := range 4 {
				ql := blk[64*(g/2):][:64]
				for k := range 8 {
					a, c := le.Uint32(ql[4*k:]), le.Uint32(ql[32+4*k:])
					var w uint32
					if g%2 == 0 {
						w = a&lo4 | (c&lo4)<<4
					} else {
						w = a>>4&lo4 | c&^lo4
					}
					le.PutUint32(o[512*g+64*k+4*r:], w)
				}
			}
			// qh word m of half h holds, in bits 2c, 2c+1 of its bytes,
			// elements l = 32c+4m+i of the half: group 8h+2c+m/4, quad m%4.
			var qh [16]uint32
			for h := range 2 {
				for m := range 8 {
					q, sh := le.Uint32(blk[128+32*h+4*m:]), 2*(m%4)
					qh[8*h+m/4] |= (q & lo2) << sh
					qh[8*h+2+m/4] |= (q >> 2 & lo2) << sh
					qh[8*h+4+m/4] |= (q >> 4 & lo2) << sh
					qh[8*h+6+m/4] |= (q >> 6 & lo2) << sh
				}
			}
			for j, w := range qh {
				le.PutUint32(o[2048+64*j+4*r:], w)
			}
			for p := range 8 {
				o[3072+32*p+2*r] = blk[192+2*p]
				o[3072+32*p+2*r+1] = blk[192+2*p+1]
			}
			copy(o[3328+2*r:][:2], blk[208:210])
		}
	}
}

// mulPackedQ6K is the reference of the repacked Q6_K kernels: per row,
// token and block the exact integer
//
//	iacc = Σ_j sc_j · Σ_{i in group j} q_i·x_i − 32·Σ_j sc_j·bsum_j
//
// over the sixteen 16-element groups j (q unsigned, 0..63), then
// acc += (float(iacc)·d)·yd (the second step fused), in block order.
func mulPackedQ6K(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
	gb := nb * packQ6KBytes
	for g := range groups {
		wg := w[g*gb:][:gb]
		for t := range nTok {
			var acc [packRows]float32
			for b := range nb {
				o := wg[b*packQ6KBytes:][:packQ6KBytes]
				yd, q8, bsums := q8K(x[t*ab+b*blockQ8_K:])
				for r := range packRows {
					var iacc int32
					for j := range 16 {
						pc, nib, s := j/4, j/2%2, j%2
						var sum int32
						for a := range 4 {
							k := 4*s + a
							for i := range 4 {
								lo := int32(o[512*pc+64*k+4*r+i] >> (4 * nib) & 0xf)
								hi := int32(o[2048+64*j+4*r+i] >> (2 * a) & 3)
								sum += (lo | hi<<4) * int32(int8(q8[16*j+4*a+i]))
							}
						}
						sc := int32(int8(o[3072+32*(j/2)+2*r+j%2]))
						iacc += sc*sum - 32*sc*bsum(bsums, j)
					}
					d := f16Table[binary.LittleEndian.Uint16(o[3328+2*r:])]
					acc[r] = fmaF32(float32(iacc)*d, yd, acc[r])
				}
			}
			copy(out[t*ldOut+g*packRows:][:packRows], acc[:])
		}
	}
}

// checkPacked panics unless the slices hold what a packed product reads and
// writes (the assembly does no bounds checks of its own).
func checkPacked(f *packFormat, nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
	rows := groups * packRows
	if nb < 0 || groups < 0 || len(w) < groups*nb*f.blockBytes || ab < nb*blockQ8_K ||
		nTok > 0 && len(x) < (nTok-1)*ab+nb*blockQ8_K || ldOut < rows && nTok > 1 ||
		nTok > 0 && len(out) < (nTok-1)*ldOut+rows {
		panic(fmt.Sprintf("ops: packed kernel arguments out of range: nb=%d groups=%d len(w)=%d nTok=%d ab=%d len(x)=%d ldOut=%d len(out)=%d",
			nb, groups, len(w), nTok, ab, len(x), ldOut, len(out)))
	}
}
