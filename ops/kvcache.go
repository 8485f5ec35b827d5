package ops

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"unsafe"

	"github.com/atsinfer/ats/gguf"
)

// KVType is the format of the cells of a KV cache.
type KVType uint8

const (
	// KVF16 is binary16, llama.cpp's default cache type.
	KVF16 KVType = iota
	// KVQ8_0 is ggml's Q8_0 (34 bytes per 32 values), quantized as
	// quantize_row_q8_0_ref does (d = amax/127, q = round(x/d)).
	KVQ8_0
	// KVQ4_0 is ggml's Q4_0 (18 bytes per 32 values), quantized as
	// quantize_row_q4_0_ref does.
	KVQ4_0
	// KVF32 is float32, for tests and references.
	KVF32
)

var kvTypeNames = [...]string{"f16", "q8_0", "q4_0", "f32"}

func (t KVType) String() string {
	if int(t) < len(kvTypeNames) {
		return kvTypeNames[t]
	}
	return fmt.Sprintf("KVType(%d)", t)
}

// ParseKVType reads a cache type as llama.cpp's -ctk/-ctv name it: f16,
// q8_0, q4_0 or f32.
func ParseKVType(s string) (KVType, error) {
	for i, n := range kvTypeNames {
		if strings.EqualFold(s, n) {
			return KVType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown KV cache type %q (want one of %s)", s, strings.Join(kvTypeNames[:], ", "))
}

// quantized reports whether the type stores blocks of 32 values.
func (t KVType) quantized() bool { return t == KVQ8_0 || t == KVQ4_0 }

// RowBytes is the size of one cell's key (or value) row of width values.
func (t KVType) RowBytes(width int) int {
	switch t {
	case KVF16:
		return 2 * width
	case KVQ8_0:
		return width / qk * blockQ8_0
	case KVQ4_0:
		return width / qk * blockQ4_0
	case KVF32:
		return 4 * width
	}
	return 0
}

// checkWidth validates a row width (or a head size, which must be whole
// blocks too, since heads are addressed inside a row) for the type.
func (t KVType) checkWidth(what string, width int) error {
	if int(t) >= len(kvTypeNames) {
		return fmt.Errorf("KV cache: unknown type %d", t)
	}
	if width <= 0 {
		return fmt.Errorf("KV cache %s: %s %d is not positive", t, what, width)
	}
	if t.quantized() && width%qk != 0 {
		return fmt.Errorf("KV cache %s: %s %d is not a multiple of its block size %d", t, what, width, qk)
	}
	return nil
}

// KVLayer is the key and value cache of one layer: Rows cells, each one
// token's key row and value row of Width = nKVHeads*HeadSize values in
// Type's format, K and V [Rows][Type.RowBytes(Width)]. Which cell holds
// which position of which sequence is the caller's bookkeeping (block
// tables, see AttnBatch).
//
// A quantized cache holds its keys and values rotated, as llama.cpp's
// does: each chunk of RotK key values (and RotV value values) is
// multiplied by the orthonormal Walsh-Hadamard matrix of that size before
// it is quantized, which spreads a head's outliers over the chunk and so
// lowers the quantization error. Attention rotates the queries the same
// way (scores are unchanged, the matrix being orthonormal) and rotates
// its outputs back. 0 means no rotation (f16 and f32 caches; a caller
// may also clear them, as LLAMA_ATTN_ROT_DISABLE does).
type KVLayer struct {
	Type        KVType
	Rows, Width int
	HeadSize    int
	RotK, RotV  int
	K, V        []byte
}

// NewKVLayer allocates the cache of one layer: rows cells of nKVHeads
// heads of headSize values.
func NewKVLayer(rows, nKVHeads, headSize int, t KVType) (*KVLayer, error) {
	if err := t.checkWidth("head size", headSize); err != nil {
		return nil, err
	}
	if rows <= 0 || nKVHeads <= 0 {
		return nil, fmt.Errorf("KV cache %s: %d rows of %d heads", t, rows, nKVHeads)
	}
	width := nKVHeads * headSize
	rb := t.RowBytes(width)
	if width/nKVHeads != headSize || rows > math.MaxInt/2/rb {
		return nil, fmt.Errorf("KV cache %s: %d rows of %d heads of %d overflow", t, rows, nKVHeads, headSize)
	}
	rk, rv := t.rotation(headSize)
	return &KVLayer{Type: t, Rows: rows, Width: width, HeadSize: headSize, RotK: rk, RotV: rv,
		K: make([]byte, rows*rb), V: make([]byte, rows*rb)}, nil
}

// rotation is the size of the Walsh-Hadamard rotation llama.cpp applies
// to keys (with the queries) and to values in a cache of type t, for
// heads of headSize: none unless the type is quantized and the head a
// multiple of 64; keys then take the largest power of two that divides
// the head, values always 64.
func (t KVType) rotation(headSize int) (k, v int) {
	if !t.quantized() || headSize%64 != 0 {
		return 0, 0
	}
	k = 64
	for headSize%(2*k) == 0 {
		k *= 2
	}
	return k, 64
}

// KVRotation is the size of the Walsh-Hadamard rotation of a cache of
// type t's keys (and the queries) and values, for heads of headSize (0:
// none), as NewKVLayer sets RotK and RotV: the GPU's cache follows the
// same rule.
func KVRotation(t KVType, headSize int) (k, v int) { return t.rotation(headSize) }

// FWHT is fwht: the rotation, in place, of each chunk of n values of x
// (the GPU's kernel is checked against it).
func FWHT(x []float32, n int) { fwht(x, n) }

// fwht applies the orthonormal Walsh-Hadamard transform to each chunk of
// n values of x (n a power of two, at least 4), as ggml's CPU fwht does:
// the values scaled by 1/sqrt(n), then butterflies (u+v, u-v) of
// growing span. The spans 1 and 2 run together on groups of four, with
// the same operations in the same order.
func fwht(x []float32, n int) {
	scale := 1 / float32(math.Sqrt(float64(n))) // 1.0f/sqrtf(n): sqrt is correctly rounded either way
	for c := 0; c+n <= len(x); c += n {
		y := x[c : c+n : c+n]
		for i := 0; i+4 <= len(y); i += 4 {
			g := y[i : i+4 : i+4]
			a, b, cc, d := g[0]*scale, g[1]*scale, g[2]*scale, g[3]*scale
			a, b = a+b, a-b
			cc, d = cc+d, cc-d
			g[0], g[2] = a+cc, a-cc
			g[1], g[3] = b+d, b-d
		}
		for span := 4; span < n; span *= 2 {
			for i := 0; i < n; i += 2 * span {
				lo, hi := y[i:i+span:i+span], y[i+span:i+2*span:i+2*span]
				hi = hi[:len(lo)]
				for j, u := range lo {
					v := hi[j]
					lo[j], hi[j] = u+v, u-v
				}
			}
		}
	}
}

// RowBytes is the size of one cell's key (or value) row.
func (l *KVLayer) RowBytes() int { return l.Type.RowBytes(l.Width) }

// Bytes is the memory the layer's cache holds.
func (l *KVLayer) Bytes() int64 { return int64(len(l.K)) + int64(len(l.V)) }

// Store writes the key and value rows of one token into cell row,
// converting them to the cache's type.
func (l *KVLayer) Store(row int, k, v []float32) error {
	if row < 0 || row >= l.Rows {
		return fmt.Errorf("KV cache: store to cell %d of %d", row, l.Rows)
	}
	if len(k) < l.Width || len(v) < l.Width {
		return fmt.Errorf("KV cache: store of key/value rows of %d/%d values into cells of %d", len(k), len(v), l.Width)
	}
	rb := l.RowBytes()
	l.storeRow(l.K[row*rb:(row+1)*rb], k[:l.Width], l.RotK)
	l.storeRow(l.V[row*rb:(row+1)*rb], v[:l.Width], l.RotV)
	return nil
}

// rotScratch holds a row being rotated before it is quantized.
var rotScratch = sync.Pool{New: func() any { return new([]float32) }}

// storeRow converts a row into dst, rotated in chunks of rot first (0:
// not rotated).
func (l *KVLayer) storeRow(dst []byte, src []float32, rot int) {
	if rot > 0 {
		buf := rotScratch.Get().(*[]float32)
		defer rotScratch.Put(buf)
		if cap(*buf) < len(src) {
			*buf = make([]float32, len(src))
		}
		r := (*buf)[:len(src)]
		copy(r, src)
		fwht(r, rot)
		src = r
	}
	switch l.Type {
	case KVF16:
		cvtF16Kernel(unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), len(src)), src)
	case KVQ8_0:
		kvQuantQ8_0(dst, src)
	case KVQ4_0:
		quantQ4_0(dst, src)
	case KVF32:
		copy(bytesF32(dst), src)
	}
}

// StoreBatch stores the key and value rows of every token of the batch
// (k and v are [n][Width]) at their cells, over the pool.
func (l *KVLayer) StoreBatch(p *Pool, b *AttnBatch, k, v []float32) error {
	n := len(b.Pos)
	if err := b.check(l); err != nil {
		return err
	}
	if len(k) < n*l.Width || len(v) < n*l.Width {
		return fmt.Errorf("KV cache: store of %d tokens from key/value buffers of %d/%d values (rows of %d)", n, len(k), len(v), l.Width)
	}
	rb := l.RowBytes()
	p.Run(n, max(1, 4096/l.Width), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			c := b.Cell(t)
			l.storeRow(l.K[c*rb:(c+1)*rb], k[t*l.Width:(t+1)*l.Width], l.RotK)
			l.storeRow(l.V[c*rb:(c+1)*rb], v[t*l.Width:(t+1)*l.Width], l.RotV)
		}
	})
	return nil
}

// kvQuantQ8_0 quantizes a row as quantize_row_q8_0_ref: the Q8_0
// activation quantizer of the level, which gives the reference's bytes
// for every finite input.
func kvQuantQ8_0(dst []byte, src []float32) { kernelQ8_0.QuantizeAct(dst, src) }

var kernelQ8_0 = kernels[gguf.TypeQ8_0]

// bytesF32 views little-endian float32 bytes as floats (amd64 and arm64
// are little-endian, as GGUF is; Go allocates byte slices of this size
// aligned to at least 8).
func bytesF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// AttnBatch is one step's query tokens as attention sees them: token t
// belongs to sequence Seq[t] (an index into Tables) at position Pos[t],
// and attends to positions 0..Pos[t] of its sequence. Position p of
// sequence s lives in cell Tables[s][p/Block]*Block + p%Block; blocks
// may be shared by several sequences (a common prefix). Tokens of one
// sequence are contiguous in the batch (a prompt chunk or one decode
// token), and every token's own key and value are stored before the
// attention runs.
type AttnBatch struct {
	Pos, Seq []int32
	Tables   [][]int32
	Block    int
}

// Cell is the cache cell of token t.
func (b *AttnBatch) Cell(t int) int {
	p := int(b.Pos[t])
	return int(b.Tables[b.Seq[t]][p/b.Block])*b.Block + p%b.Block
}

// attnTileKeys is the key tile of the attention kernels: Block must be a
// multiple of it, so that a tile never straddles two blocks.
const attnTileKeys = 64

// check validates the batch against a cache: block size, sequence
// indices, positions and the cells their tables lead to (every position
// a token may read, not only its own).
func (b *AttnBatch) check(l *KVLayer) error {
	if len(b.Pos) != len(b.Seq) {
		return fmt.Errorf("attention batch: %d positions for %d sequence indices", len(b.Pos), len(b.Seq))
	}
	if b.Block < attnTileKeys || b.Block&(b.Block-1) != 0 {
		return fmt.Errorf("attention batch: block size %d is not a power of two of at least %d", b.Block, attnTileKeys)
	}
	if l.Rows%b.Block != 0 {
		return fmt.Errorf("attention batch: cache of %d cells is not whole blocks of %d", l.Rows, b.Block)
	}
	nb := int32(l.Rows / b.Block)
	need := make([]int32, len(b.Tables)) // blocks each sequence's tokens read
	for t, s := range b.Seq {
		if s < 0 || int(s) >= len(b.Tables) {
			return fmt.Errorf("attention batch: token %d of sequence %d, batch has %d", t, s, len(b.Tables))
		}
		p := b.Pos[t]
		if p < 0 {
			return fmt.Errorf("attention batch: token %d at position %d", t, p)
		}
		if int(p)/b.Block >= len(b.Tables[s]) {
			return fmt.Errorf("attention batch: token %d at position %d of sequence %d, whose table has %d blocks of %d", t, p, s, len(b.Tables[s]), b.Block)
		}
		need[s] = max(need[s], p/int32(b.Block)+1)
	}
	for s, n := range need {
		for i, id := range b.Tables[s][:n] {
			if id < 0 || id >= nb {
				return fmt.Errorf("attention batch: sequence %d's block %d is block %d of a cache of %d", s, i, id, nb)
			}
		}
	}
	return nil
}
