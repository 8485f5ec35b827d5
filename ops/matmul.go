package ops

import "fmt"

// Matrix is a weight matrix in its file format: Rows rows of Cols values,
// each row RowBytes long, stored back to back (a view of the mapped file).
type Matrix struct {
	Kernel     *Kernel
	Rows, Cols int
	Data       []byte

	packed *packedCopy // see Repack; nil without one
}

// NewMatrix checks that data holds rows×cols values of type k.
func NewMatrix(k *Kernel, rows, cols int, data []byte) (Matrix, error) {
	if cols%k.BlockSize != 0 {
		return Matrix{}, fmt.Errorf("%d columns of %s: not a multiple of the block size %d", cols, k.Type, k.BlockSize)
	}
	if want := rows * k.RowBytes(cols); len(data) != want {
		return Matrix{}, fmt.Errorf("%d×%d %s needs %d bytes, have %d", rows, cols, k.Type, want, len(data))
	}
	return Matrix{Kernel: k, Rows: rows, Cols: cols, Data: data}, nil
}

// Row returns the bytes of row r.
func (m Matrix) Row(r int) []byte {
	rb := m.Kernel.RowBytes(m.Cols)
	return m.Data[r*rb : (r+1)*rb]
}

// Slice returns rows [lo, hi) as a matrix (an expert of a stacked tensor).
func (m Matrix) Slice(lo, hi int) Matrix {
	rb := m.Kernel.RowBytes(m.Cols)
	return Matrix{Kernel: m.Kernel, Rows: hi - lo, Cols: m.Cols, Data: m.Data[lo*rb : hi*rb], packed: m.slicePacked(lo, hi)}
}

// ActBytes is the scratch QuantizeActs needs for nTok rows.
func (m Matrix) ActBytes(nTok int) int { return nTok * m.Kernel.ActRowBytes(m.Cols) }

// QuantizeActs converts nTok activation rows (x is [nTok][Cols]) into the
// format the weight type's dot product takes, into scratch.
func (m Matrix) QuantizeActs(p *Pool, x []float32, nTok int, scratch []byte) []byte {
	ab := m.Kernel.ActRowBytes(m.Cols)
	xq := scratch[:nTok*ab]
	p.Run(nTok, 1, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			m.Kernel.QuantizeAct(xq[t*ab:(t+1)*ab], x[t*m.Cols:(t+1)*m.Cols])
		}
	})
	return xq
}

// MulQ computes out[t*ldOut + r] = W[r]·x[t] for every row r and token
// t < nTok, from activations already quantized by QuantizeActs. Rows are
// split across the pool; each weight row is read once for all tokens.
func (m Matrix) MulQ(p *Pool, xq []byte, nTok int, out []float32, ldOut int) {
	if m.usePacked() {
		mulPackedGroup(p, []Matrix{m}, [][]byte{xq}, nTok, [][]float32{out}, []int{ldOut})
		return
	}
	p.RunChunks(m.Rows, chunkRows(m.Kernel.RowBytes(m.Cols), nTok), func(lo, hi int) {
		m.MulRows(lo, hi, xq, nTok, out, ldOut)
	})
}

// RowGroup is the row alignment of MulRows: a repacked matrix computes
// its rows sixteen at a time.
const RowGroup = packRows

// MulRows computes rows [lo, hi) of MulQ's product on the calling
// goroutine, without the pool: out[t*ldOut + r] for lo <= r < hi and every
// token t < nTok. It is for callers that split the work of several
// products over the pool themselves (a thread owning some output rows of
// each). When m is repacked, lo must be a multiple of RowGroup, and hi too
// unless it is Rows. Each row gets what MulQ gives it: the same kernel over
// the same bytes.
func (m Matrix) MulRows(lo, hi int, xq []byte, nTok int, out []float32, ldOut int) {
	ab := m.Kernel.ActRowBytes(m.Cols)
	if m.usePacked() {
		if lo%RowGroup != 0 || hi%RowGroup != 0 && hi != m.Rows {
			panic(fmt.Sprintf("ops: MulRows [%d, %d) of %d repacked rows: not whole groups of %d", lo, hi, m.Rows, RowGroup))
		}
		pg := m.packed.groups
		if ga, gb := lo/packRows, min(hi/packRows, pg); ga < gb {
			gbytes := len(m.packed.data) / pg
			packedMul[m.Kernel.Type](m.Cols/m.Kernel.BlockSize, m.packed.data[ga*gbytes:gb*gbytes], gb-ga, xq, ab, nTok, out[ga*packRows:], ldOut)
		}
		lo = max(lo, pg*packRows) // the rows after the groups: row kernel
	}
	if lo < hi {
		rb := m.Kernel.RowBytes(m.Cols)
		m.Kernel.mul(m.Cols, m.Data[lo*rb:hi*rb], rb, hi-lo, xq, ab, nTok, out[lo:], ldOut)
	}
}

// Mul computes out = W·x for nTok rows of x ([nTok][Cols]) into out
// ([nTok][ldOut], first Rows columns), quantizing x into scratch.
func (m Matrix) Mul(p *Pool, x []float32, nTok int, out []float32, ldOut int, scratch []byte) {
	m.MulQ(p, m.QuantizeActs(p, x, nTok, scratch), nTok, out, ldOut)
}

// DequantizeRow decodes row r into dst (len Cols).
func (m Matrix) DequantizeRow(r int, dst []float32) { m.Kernel.Dequantize(dst[:m.Cols], m.Row(r)) }

// MulQGroup computes out_i[t*ldOut_i + r] = W_i[r]·x[t] for several
// matrices over the same quantized activations (all with the same Cols and
// activation format, as for Q, K and V), splitting their rows together over
// the pool: one dispatch and one barrier instead of one per matrix.
func MulQGroup(p *Pool, ms []Matrix, xq []byte, nTok int, outs [][]float32, ldOuts []int) {
	xqs := make([][]byte, len(ms))
	for i := range xqs {
		xqs[i] = xq
	}
	MulQEach(p, ms, xqs, nTok, outs, ldOuts)
}

// MulQEach is MulQGroup with an input of its own for each matrix: out_i =
// W_i·x_i, xqs[i] quantized for W_i (the chosen experts' down projections
// of one token, each reading its own expert's activations). The matrices
// share Cols and activation format; one dispatch and one barrier for all.
func MulQEach(p *Pool, ms []Matrix, xqs [][]byte, nTok int, outs [][]float32, ldOuts []int) {
	if len(ms) == 0 {
		return
	}
	total := 0
	packed := false
	for _, m := range ms {
		if m.Cols != ms[0].Cols || m.Kernel.ActType != ms[0].Kernel.ActType {
			panic("ops: MulQEach: matrices differ in columns or activation format")
		}
		total += m.Rows
		if m.usePacked() {
			packed = true
		}
	}
	if packed {
		mulPackedGroup(p, ms, xqs, nTok, outs, ldOuts)
		return
	}
	p.RunChunks(total, chunkRows(ms[0].Kernel.RowBytes(ms[0].Cols), nTok), func(lo, hi int) {
		base := 0
		for i, m := range ms {
			if a, b := max(lo-base, 0), min(hi-base, m.Rows); a < b {
				m.MulRows(a, b, xqs[i], nTok, outs[i], ldOuts[i])
			}
			base += m.Rows
		}
	})
}

// chunkBytes is about the weight traffic of one chunk of a product handed
// to a thread: some microseconds of work, against a hand-off of about one.
const chunkBytes = 64 << 10

// rowBlockBytes is the weight bytes a kernel keeps in the L1/L2 cache while
// several token groups pass over them (see the amd64 mul).
const rowBlockBytes = 16 << 10

// chunkRows is the smallest chunk of rows (of rb bytes) for nTok tokens
// that the pool hands a thread (RunChunks starts bigger and ends there).
// The work per row grows with the tokens (a 4-token pass costs about two
// 1-token passes), so prefill chunks have fewer rows, but never fewer than
// a cache block: the activations are read once per block.
func chunkRows(rb, nTok int) int {
	size := max(8, chunkBytes/(rb*max(1, nTok/2)))
	if nTok > 1 {
		size = max(size, rowBlockBytes/rb)
	}
	return size
}
