package kernels

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
)

// Norm holds the kernels of norm.cu (RMSNorm, plain and fused with the
// residual add) for one context.
type Norm struct {
	lazyModule
	rmsNorm    *cudadrv.Function
	addRMSNorm *cudadrv.Function
	rmsNormEx  *cudadrv.Function
	// rmsNormExMoE is rms_norm_ex with the MoE sum's register paths.
	rmsNormExMoE *cudadrv.Function
}

// NewNorm prepares norm.cu's kernels for the context's device; the module
// loads at the first launch.
func NewNorm(ctx *cudadrv.Context) (*Norm, error) {
	k := &Norm{}
	err := k.prepareLookup(ctx, "norm", map[string]**cudadrv.Function{
		"rms_norm_f32":     &k.rmsNorm,
		"add_rms_norm_f32": &k.addRMSNorm,
		"rms_norm_ex":      &k.rmsNormEx,
		"rms_norm_ex_moe":  &k.rmsNormExMoE,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadNorm is NewNorm with the module loaded now.
func LoadNorm(ctx *cudadrv.Context) (*Norm, error) { return loadNow(NewNorm(ctx)) }

// normBlock picks the threads of the block that normalises one row of cols:
// about four columns a thread, a multiple of the warp, at most 1024.
func normBlock(cols int) cudadrv.Dim3 {
	t := (cols/4 + 31) &^ 31
	return cudadrv.D1(min(1024, max(32, t)))
}

// normGrid is one block per row, capped; the kernel strides over the rest.
func normGrid(rows int) cudadrv.Dim3 { return cudadrv.D1(max(1, min(rows, 1<<16))) }

func checkNorm(cols, rows int) error {
	if cols <= 0 || rows < 0 || cols > 1<<30 {
		return fmt.Errorf("kernels: rms norm of %d rows of %d", rows, cols)
	}
	return nil
}

// RMSNorm queues dst[r] = rmsnorm(src[r]) * w for rows rows of cols floats
// (w: cols floats, or 0 for no weight). dst may equal src. A per-head norm
// is the same call with one row per head.
func (k *Norm) RMSNorm(s *cudadrv.Stream, dst, src, w cudadrv.DevicePtr, cols int, eps float32, rows int) error {
	if err := checkNorm(cols, rows); err != nil || rows == 0 {
		return err
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.rmsNorm, s, normGrid(rows), normBlock(cols), 0, func(a *cudadrv.Args) {
		a.Ptr(dst).Ptr(src).Ptr(w).I32(int32(cols)).F32(eps).I64(int64(rows))
	})
}

// AddRMSNorm queues sum = a + b, then dst = rmsnorm(sum) * w, row by row:
// the residual add and the norm that follows it in one pass. sum may equal
// a or b; dst must differ from all three.
func (k *Norm) AddRMSNorm(s *cudadrv.Stream, sum, a, b, dst, w cudadrv.DevicePtr, cols int, eps float32, rows int) error {
	if err := checkNorm(cols, rows); err != nil || rows == 0 {
		return err
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.addRMSNorm, s, normGrid(rows), normBlock(cols), 0, func(p *cudadrv.Args) {
		p.Ptr(sum).Ptr(a).Ptr(b).Ptr(dst).Ptr(w).I32(int32(cols)).F32(eps).I64(int64(rows))
	})
}

// NormEx describes an rms_norm_ex launch (norm.cu): an RMSNorm with what
// surrounds it in a decoder fused in. Zero pointers leave parts out. Per
// row r of Cols floats:
//
//	term = B[r], or Σ_j Y[r][j]·YW[r][j] when K > 0 (the MoE weighted sum)
//	x    = A[r] + term (A[r] without a term)
//	BOut[r] = term; Sum[r] = x
//	Dst[r] = rmsnorm(x)·W; Q8 = Q8_1 of Dst[r] (Q8_1Bytes layout, Cols % 32 == 0)
type NormEx struct {
	Sum, A, B  cudadrv.DevicePtr
	Y, YW      cudadrv.DevicePtr // [Rows][K][Cols], [Rows][K]
	K          int
	BOut       cudadrv.DevicePtr
	Dst, W     cudadrv.DevicePtr
	Q8         cudadrv.DevicePtr // Q8_1 activations of Dst: Q8_1PlanesBytes(Q8Planes, Rows, Cols)
	Q8Planes   int               // 1 (or 0) or 2 (see Q8_1PlanesBytes)
	Cols, Rows int
	Eps        float32
}

// RMSNormEx queues the fused norm a describes.
func (k *Norm) RMSNormEx(s *cudadrv.Stream, a *NormEx) error {
	if err := checkNorm(a.Cols, a.Rows); err != nil || a.Rows == 0 {
		return err
	}
	var q, ds cudadrv.DevicePtr
	var plane int64
	if a.Q8 != 0 {
		if a.Cols%32 != 0 || a.Dst == 0 {
			return fmt.Errorf("kernels: Q8_1 output of a norm of %d columns", a.Cols)
		}
		var err error
		if ds, plane, err = q8Planes(a.Q8, a.Q8Planes, a.Rows, a.Cols); err != nil {
			return err
		}
		q = a.Q8
	}
	if err := k.ready(); err != nil {
		return err
	}
	f, block := k.rmsNormEx, normBlock(a.Cols)
	if a.K > 0 {
		// The MoE sum's register path holds NORM_MOE_SLOTS values per
		// column: two columns a thread, not normBlock's four.
		f, block = k.rmsNormExMoE, cudadrv.D1(min(1024, max(32, (a.Cols/2+31)&^31)))
	}
	return launch(f, s, normGrid(a.Rows), block, 0, func(p *cudadrv.Args) {
		p.Ptr(a.Sum).Ptr(a.A).Ptr(a.B).Ptr(a.Y).Ptr(a.YW).I32(int32(a.K)).Ptr(a.BOut).
			Ptr(a.Dst).Ptr(a.W).Ptr(q).Ptr(ds).I64(plane).I32(int32(a.Cols)).F32(a.Eps).I64(int64(a.Rows))
	})
}
