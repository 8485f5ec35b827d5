package ops

import "fmt"

// Matrix is a weight matrix in its file format: Rows rows of Cols values,
// each row RowBytes long, stored back to back (a view of the mapped file).
type Matrix struct {
	Kernel     *Kernel
	Rows, Cols int
	Data       []byte
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
	return Matrix{Kernel: m.Kernel, Rows: hi - lo, Cols: m.Cols, Data: m.Data[lo*rb : hi*rb]}
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
	ab := m.Kernel.ActRowBytes(m.Cols)
	rb := m.Kernel.RowBytes(m.Cols)
	dot := m.Kernel.Dot
	p.Run(m.Rows, 8, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			w := m.Data[r*rb : (r+1)*rb]
			for t := 0; t < nTok; t++ {
				out[t*ldOut+r] = dot(m.Cols, w, xq[t*ab:(t+1)*ab])
			}
		}
	})
}

// Mul computes out = W·x for nTok rows of x ([nTok][Cols]) into out
// ([nTok][ldOut], first Rows columns), quantizing x into scratch.
func (m Matrix) Mul(p *Pool, x []float32, nTok int, out []float32, ldOut int, scratch []byte) {
	m.MulQ(p, m.QuantizeActs(p, x, nTok, scratch), nTok, out, ldOut)
}

// DequantizeRow decodes row r into dst (len Cols).
func (m Matrix) DequantizeRow(r int, dst []float32) { m.Kernel.Dequantize(dst[:m.Cols], m.Row(r)) }
