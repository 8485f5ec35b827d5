package kernels

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
)

// GLU holds the kernels of glu.cu (SwiGLU and the bias add) for one
// context.
type GLU struct {
	lazyModule
	swiglu   *cudadrv.Function
	swigluQ8 *cudadrv.Function
	addBias  *cudadrv.Function
}

// NewGLU prepares glu.cu's kernels for the context's device; the module
// loads at the first launch.
func NewGLU(ctx *cudadrv.Context) (*GLU, error) {
	k := &GLU{}
	err := k.prepareLookup(ctx, "glu", map[string]**cudadrv.Function{
		"swiglu_f32":   &k.swiglu,
		"swiglu_q8_1":  &k.swigluQ8,
		"add_bias_f32": &k.addBias,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadGLU is NewGLU with the module loaded now.
func LoadGLU(ctx *cudadrv.Context) (*GLU, error) { return loadNow(NewGLU(ctx)) }

const gluBlock = 256

// SwiGLU queues out[r][c] = silu(gate[r*ld+c]) * up[r*ld+c] for c < width,
// r < rows; out is [rows][width]. Separate gate and up buffers: ld = width.
// Both halves of one row: gate = in, up = in + 4*width bytes, ld = 2*width.
// out may equal gate when ld = width.
func (k *GLU) SwiGLU(s *cudadrv.Stream, out, gate, up cudadrv.DevicePtr, width, ld, rows int) error {
	n := width * rows
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.swiglu, s, grid1(n, gluBlock), cudadrv.D1(gluBlock), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(gate).Ptr(up).I32(int32(width)).I32(int32(ld)).I64(int64(rows))
	})
}

// AddBias queues x[r][c] += b[c] for c < width, r < rows.
func (k *GLU) AddBias(s *cudadrv.Stream, x, b cudadrv.DevicePtr, width, rows int) error {
	n := width * rows
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.addBias, s, grid1(n, gluBlock), cudadrv.D1(gluBlock), 0, func(a *cudadrv.Args) {
		a.Ptr(x).Ptr(b).I32(int32(width)).I64(int64(rows))
	})
}

// SwiGLUQ8 is SwiGLU that also writes out in the Q8_1 layout of
// QuantizeQ8_1Planes at q8 (Q8_1PlanesBytes(planes, rows, width); width %
// 32 == 0): the input of the matrix-vector product that follows, without
// a launch of its own.
func (k *GLU) SwiGLUQ8(s *cudadrv.Stream, out, gate, up cudadrv.DevicePtr, width, ld, rows int, q8 cudadrv.DevicePtr, planes int) error {
	n := width * rows
	if width%32 != 0 {
		return fmt.Errorf("kernels: Q8_1 output of a SwiGLU of width %d", width)
	}
	ds, plane, err := q8Planes(q8, planes, rows, width)
	if err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.swigluQ8, s, grid1(n, gluBlock), cudadrv.D1(gluBlock), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(gate).Ptr(up).I32(int32(width)).I32(int32(ld)).I64(int64(rows)).
			Ptr(q8).Ptr(ds).I64(plane)
	})
}
