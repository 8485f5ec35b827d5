package kernels

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
)

// MoEMatVecQ8_1 is MoEMatMul's matrix-vector path (quantized weights, nTok
// <= MoEMatVecMaxTokens) reading activations already in the Q8_1 layout of
// QuantizeQ8_1 at xq: e.PerSlot ? nTok*e.K : nTok rows of e.Cols. The GPU
// executor's norm and SwiGLU kernels write that form themselves, and the
// gate and up products share one, so a decode step of an MoE layer
// quantizes nothing on its own.
//
// It is MoEMatVecQ8_1Group of one stack: the launch of MoEMatMul's
// matrix-vector path (mvArgs, mvLaunch) without the quantization before it.
func (w *WeightOps) MoEMatVecQ8_1(s *cudadrv.Stream, e MoE, ids, xq cudadrv.DevicePtr, nTok int, out cudadrv.DevicePtr, ldOut int) error {
	return w.MoEMatVecQ8_1Group(s, []MoE{e}, ids, xq, nTok, []cudadrv.DevicePtr{out}, []int{ldOut})
}

// MoEMatVecQ8_1Group is MoEMatVecQ8_1 for up to MaxMatVecGroup expert
// stacks of one quantized type, width, top k and input (an MoE layer's gate
// and up), in one launch: outs[i] gets stack i's products, ldOut apart.
func (w *WeightOps) MoEMatVecQ8_1Group(s *cudadrv.Stream, es []MoE, ids, xq cudadrv.DevicePtr, nTok int, outs []cudadrv.DevicePtr, ldOut []int) error {
	if len(es) < 1 || len(es) > MaxMatVecGroup || len(outs) != len(es) || len(ldOut) != len(es) {
		return fmt.Errorf("kernels: MoE matvec group of %d stacks (1 to %d, an output each)", len(es), MaxMatVecGroup)
	}
	e := es[0]
	k, err := w.kernels(e.Matrix)
	if err != nil {
		return err
	}
	if isFloat(e.Type) || nTok < 1 || nTok > MoEMatVecMaxTokens || e.K < 1 || e.NExpert < 1 || e.NExpert > maxMoEExperts {
		return fmt.Errorf("kernels: Q8_1 MoE matvec of %s, %d experts, %d per token, %d tokens", e.Type, e.NExpert, e.K, nTok)
	}
	actDiv := e.K
	if e.PerSlot {
		actDiv = 1
	}
	rows := e.inputRows(nTok)
	p := mvArgs{w: e.Data, rowBytes: int64(e.RowBytes()), rows: int32(e.Rows), cols: int32(e.Cols),
		ntok: 1, out: outs[0], ldOut: int64(ldOut[0]), ids: ids, expertBytes: int64(e.Bytes()), actDiv: int32(actDiv),
		xq: xq, xds: xq.Add(align16(rows * e.Cols))}
	for i, o := range es[1:] {
		if o.Type != e.Type || o.Cols != e.Cols || o.K != e.K || o.PerSlot != e.PerSlot || o.NExpert < 1 || o.NExpert > maxMoEExperts {
			return fmt.Errorf("kernels: MoE matvec group of %s x %d (top %d) with %s x %d (top %d)", e.Type, e.Cols, e.K, o.Type, o.Cols, o.K)
		}
		p.m[i] = mvMember{w: o.Data, out: outs[i+1], rowBytes: int64(o.RowBytes()), ldOut: int64(ldOut[i+1]), expertBytes: int64(o.Bytes()), rows: int32(o.Rows)}
	}
	p.nextra = int32(len(es) - 1)
	return w.mvLaunch(s, k, e.Matrix, &p, 1, nTok*e.K)
}
