package kernels

import (
	"fmt"
	"math"

	"github.com/atsinfer/ats/cudadrv"
)

// Elementwise holds the kernels of elementwise.cu for one context.
type Elementwise struct {
	lazyModule
	addF32   *cudadrv.Function
	scaleF32 *cudadrv.Function
	copyF32  *cudadrv.Function
	gather   *cudadrv.Function
	fwht     *cudadrv.Function
}

// NewElementwise prepares elementwise.cu's kernels for the context's device;
// the module loads at the first launch.
func NewElementwise(ctx *cudadrv.Context) (*Elementwise, error) {
	k := &Elementwise{}
	err := k.prepareLookup(ctx, "elementwise", map[string]**cudadrv.Function{
		"add_f32":         &k.addF32,
		"scale_f32":       &k.scaleF32,
		"copy_f32":        &k.copyF32,
		"gather_rows_f32": &k.gather,
		"fwht_f32":        &k.fwht,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadElementwise is NewElementwise with the module loaded now.
func LoadElementwise(ctx *cudadrv.Context) (*Elementwise, error) { return loadNow(NewElementwise(ctx)) }

const elementwiseBlock = 256

// AddF32 queues dst[i] = a[i] + b[i] for i < n on s. dst may alias a or b.
func (k *Elementwise) AddF32(s *cudadrv.Stream, dst, a, b cudadrv.DevicePtr, n int) error {
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.addF32, s, grid1(n, elementwiseBlock), cudadrv.D1(elementwiseBlock), 0, func(p *cudadrv.Args) {
		p.Ptr(dst).Ptr(a).Ptr(b).I64(int64(n))
	})
}

// ScaleF32 queues dst[i] = src[i] * scale for i < n on s.
func (k *Elementwise) ScaleF32(s *cudadrv.Stream, dst, src cudadrv.DevicePtr, scale float32, n int) error {
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.scaleF32, s, grid1(n, elementwiseBlock), cudadrv.D1(elementwiseBlock), 0, func(p *cudadrv.Args) {
		p.Ptr(dst).Ptr(src).F32(scale).I64(int64(n))
	})
}

// CopyF32 queues dst[i] = src[i] for i < n on s, by the SMs: either pointer
// may be mapped pinned host memory, which makes this the zero-copy transfer
// of activations between the backends (it never waits behind weight copies
// on the copy engine). dst and src must not overlap.
func (k *Elementwise) CopyF32(s *cudadrv.Stream, dst, src cudadrv.DevicePtr, n int) error {
	if err := k.ready(); err != nil {
		return err
	}
	// float4 per thread: a quarter of the threads.
	return launch(k.copyF32, s, grid1((n+3)/4, elementwiseBlock), cudadrv.D1(elementwiseBlock), 0, func(p *cudadrv.Args) {
		p.Ptr(dst).Ptr(src).I64(int64(n))
	})
}

// GatherRows queues dst[i] = src[idx[i]] for i < n, rows of width floats
// (dst [n][width], src [..][width]), idx a device array of n int32 row
// indices: the rows of the output head. dst and src must not overlap.
func (k *Elementwise) GatherRows(s *cudadrv.Stream, dst, src, idx cudadrv.DevicePtr, width, n int) error {
	if n == 0 {
		return nil
	}
	if width <= 0 || n < 0 || dst == 0 || src == 0 || idx == 0 {
		return fmt.Errorf("kernels: GatherRows of %d rows of %d floats (dst %#x, src %#x, idx %#x)", n, width, dst, src, idx)
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.gather, s, grid1(n*width, elementwiseBlock), cudadrv.D1(elementwiseBlock), 0, func(p *cudadrv.Args) {
		p.Ptr(dst).Ptr(src).Ptr(idx).I32(int32(width)).I32(int32(n))
	})
}

// FWHT queues the orthonormal Walsh-Hadamard transform of each of chunks
// chunks of n floats at x, in place (n a power of two, 4 to 1024): the
// rotation of a quantized KV cache's keys, values and queries, as
// ops.FWHT computes it, bit for bit.
func (k *Elementwise) FWHT(s *cudadrv.Stream, x cudadrv.DevicePtr, chunks, n int) error {
	if chunks == 0 {
		return nil
	}
	if n < 4 || n > 1024 || n&(n-1) != 0 || chunks < 0 || x == 0 {
		return fmt.Errorf("kernels: FWHT of %d chunks of %d floats at %#x (a power of two from 4 to 1024)", chunks, n, x)
	}
	if err := k.ready(); err != nil {
		return err
	}
	scale := 1 / float32(math.Sqrt(float64(n))) // as ops.FWHT: 1.0f/sqrtf(n)
	return launch(k.fwht, s, cudadrv.D1(min(chunks, 65535)), cudadrv.D1(n/2), 0, func(p *cudadrv.Args) {
		p.Ptr(x).I64(int64(chunks)).I32(int32(n)).F32(scale)
	})
}
