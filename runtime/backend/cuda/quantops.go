package cuda

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/ir"
)

// quantOps adapts kernels.WeightOps (matvec.cu, matmul.cu: the GGUF blocks
// read as they are, activations quantized on the device, tensor cores for
// prefill) to the executor's WeightOps.
type quantOps struct {
	k *kernels.WeightOps
	// planes is the Q8_1 planes of the dense products' activations (1 or
	// 2: kernels.Q8_1PlanesBytes); MoE products read one.
	planes int
}

// q8 is the format of the dense products' Q8_1 activations for nTok
// rows. Products of several rows read the first plane alone unless the
// kernels are set to read both (kernels.WeightOps.SetBatchPlanes), so
// their producers (quantize, norm, SwiGLU, attention) write that one.
func (q *quantOps) q8(nTok int) actFormat {
	if q.planes == 2 && (nTok == 1 || q.k.BatchPlanes()) {
		return actQ8_1x2
	}
	return actQ8_1
}

func (q *quantOps) Name() string { return "quantized (GGUF blocks, kernels.WeightOps)" }

// DeviceBytes: the tensor's bytes as the file holds them.
func (q *quantOps) DeviceBytes(w *ir.Weight) int64 { return int64(len(w.Data)) }

func (q *quantOps) Upload(s *cudadrv.Stream, w *ir.Weight, dst cudadrv.DevicePtr) (mat, error) {
	if err := s.CopyHtoD(dst, w.Data); err != nil {
		return mat{}, err
	}
	return matOf(w, dst), nil
}

func (q *quantOps) matrix(m *mat) kernels.Matrix {
	return kernels.Matrix{Type: m.W.Type, Data: m.Ptr, Rows: m.Rows, Cols: m.Cols}
}

func (q *quantOps) moe(m *mat, topK int, perSlot bool) kernels.MoE {
	return kernels.MoE{Matrix: q.matrix(m), NExpert: m.Experts, K: topK, PerSlot: perSlot}
}

func (q *quantOps) ScratchBytes(m *mat, nTok int) int {
	return kernels.MatMulScratchBytes(q.matrix(m), nTok)
}

func (q *quantOps) MoEScratchBytes(m *mat, nTok, topK int, perSlot bool) int {
	return kernels.MoEScratchBytes(q.moe(m, topK, perSlot), nTok)
}

func (q *quantOps) MatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int, scratch cudadrv.DevicePtr) error {
	return q.k.MatMul(s, q.matrix(m), x, m.Cols, nTok, out, ldOut, scratch)
}

var _ moeReuseOps = (*quantOps)(nil)

func (q *quantOps) MoEMatMulReusing(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr, reuse kernels.MoEReuse) error {
	return q.k.MoEMatMulReusing(s, q.moe(m, topK, perSlot), ids, x, m.Cols, nTok, out, m.Rows, scratch, reuse)
}

func (q *quantOps) GetRows(s *cudadrv.Stream, m *mat, ids cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr) error {
	return q.k.GetRows(s, q.matrix(m), ids, nTok, out, m.Cols)
}

func (q *quantOps) MoEMatMul(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr) error {
	return q.k.MoEMatMul(s, q.moe(m, topK, perSlot), ids, x, m.Cols, nTok, out, m.Rows, scratch)
}

// quantOps reads Q8_1 activations in the matrix-vector path, f16 in the
// tensor-core path, and float32 for float weights in the former.
var _ preparedOps = (*quantOps)(nil)

func isFloatType(t gguf.Type) bool {
	return t == gguf.TypeF32 || t == gguf.TypeF16 || t == gguf.TypeBF16
}

func (q *quantOps) InputFormat(m *mat, nTok int, decode bool) actFormat {
	switch {
	case isFloatType(m.W.Type) && nTok <= kernels.MatVecMaxTokens:
		return actF32
	case isFloatType(m.W.Type) || nTok > kernels.MatVecQ8_1MaxTokens:
		return actF16
	case nTok > kernels.MatVecMaxTokens && !decode:
		// Beyond one matvec launch, only decode rows of many sequences
		// take the matvec in runs (its cost grows with the rows); prompt
		// chunks keep the tensor cores' f16 activations, whose rounding
		// the oracles' margins were measured with.
		return actF16
	}
	return q.q8(nTok)
}

func (q *quantOps) InputBytes(f actFormat, nTok, cols int) int {
	switch f {
	case actQ8_1, actQ8_1x2:
		return kernels.Q8_1PlanesBytes(f.q8Planes(), nTok, cols)
	case actF16:
		return kernels.F16Bytes(nTok, cols)
	}
	return 0
}

func (q *quantOps) Prepare(s *cudadrv.Stream, f actFormat, x cudadrv.DevicePtr, nTok, cols int, dst cudadrv.DevicePtr) error {
	switch f {
	case actQ8_1, actQ8_1x2:
		return q.k.QuantizeQ8_1Planes(s, x, cols, nTok, cols, f.q8Planes(), dst)
	case actF16:
		return q.k.ConvertF16(s, x, cols, nTok, cols, dst)
	}
	return nil
}

func (q *quantOps) MatMulPrepared(s *cudadrv.Stream, m *mat, f actFormat, x cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error {
	switch f {
	case actQ8_1, actQ8_1x2:
		return q.k.MatVecQ8_1GroupPlanes(s, []kernels.Matrix{q.matrix(m)}, x, f.q8Planes(), nTok, []cudadrv.DevicePtr{out}, []int{ldOut})
	case actF16:
		return q.k.MatMulF16(s, q.matrix(m), x, nTok, out, ldOut)
	}
	return q.k.MatVecF32(s, q.matrix(m), x, m.Cols, nTok, out, ldOut)
}

var _ multiPreparedOps = (*quantOps)(nil)

func (q *quantOps) MultiMax() int { return kernels.MaxF16Products }

// MultiFits: one tensor-core launch takes matrices of one type and width.
func (q *quantOps) MultiFits(a, b *mat) bool {
	return a.W.Type == b.W.Type && a.Cols == b.Cols && a.Experts == 1 && b.Experts == 1
}

func (q *quantOps) MatMulF16Multi(s *cudadrv.Stream, ms []*mat, x cudadrv.DevicePtr, nTok int, outs []cudadrv.DevicePtr, lds []int) error {
	var ps [kernels.MaxF16Products]kernels.F16Product
	if len(ms) > len(ps) {
		return fmt.Errorf("%d products in one launch, at most %d", len(ms), len(ps))
	}
	for i, m := range ms {
		ps[i] = kernels.F16Product{M: q.matrix(m), Out: outs[i], LdOut: lds[i]}
	}
	return q.k.MatMulF16Multi(s, ps[:len(ms)], x, nTok)
}

var _ moePreparedOps = (*quantOps)(nil)

func (q *quantOps) MoEInputFormat(m *mat, nTok int) actFormat {
	if nTok > kernels.MoEMatVecMaxTokens || isFloatType(m.W.Type) {
		return actMixed
	}
	return actQ8_1
}

func (q *quantOps) MoEMatMulPrepared(s *cudadrv.Stream, m *mat, xq cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr) error {
	return q.k.MoEMatVecQ8_1(s, q.moe(m, topK, perSlot), ids, xq, nTok, out, m.Rows)
}

var _ groupedOps = (*quantOps)(nil)

// MatMulPreparedGroup runs the Q8_1 products of ms (one type and width, no
// more than kernels.MaxMatVecGroup; activations in planes planes) in one
// launch; false when they differ.
func (q *quantOps) MatMulPreparedGroup(s *cudadrv.Stream, ms []*mat, xq cudadrv.DevicePtr, planes, nTok int, outs []cudadrv.DevicePtr, lds []int) (bool, error) {
	if !sameQuantType(ms) || nTok > kernels.MatVecQ8_1MaxTokens {
		return false, nil
	}
	km := make([]kernels.Matrix, len(ms))
	for i, m := range ms {
		km[i] = q.matrix(m)
	}
	return true, q.k.MatVecQ8_1GroupPlanes(s, km, xq, planes, nTok, outs, lds)
}

// MoEMatMulPreparedGroup runs the Q8_1 products of the expert stacks ms
// (one type and width; every slot reads its token's row of xq) in one
// launch; false when they differ.
func (q *quantOps) MoEMatMulPreparedGroup(s *cudadrv.Stream, ms []*mat, xq, ids cudadrv.DevicePtr, nTok, topK int, outs []cudadrv.DevicePtr) (bool, error) {
	if !sameQuantType(ms) || nTok > kernels.MoEMatVecMaxTokens {
		return false, nil
	}
	es := make([]kernels.MoE, len(ms))
	lds := make([]int, len(ms))
	for i, m := range ms {
		es[i], lds[i] = q.moe(m, topK, false), m.Rows
	}
	return true, q.k.MoEMatVecQ8_1Group(s, es, ids, xq, nTok, outs, lds)
}

func sameQuantType(ms []*mat) bool {
	if len(ms) == 0 || len(ms) > kernels.MaxMatVecGroup || isFloatType(ms[0].W.Type) {
		return false
	}
	for _, m := range ms[1:] {
		if m.W.Type != ms[0].W.Type || m.Cols != ms[0].Cols {
			return false
		}
	}
	return true
}
