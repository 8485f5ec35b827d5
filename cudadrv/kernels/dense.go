package kernels

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
)

// Dense holds the kernels of dense.cu: the reference products of float32
// weights with float32 activations, for one context.
type Dense struct {
	lazyModule
	matmul    *cudadrv.Function
	matmulT8  *cudadrv.Function
	getRows   *cudadrv.Function
	moeMatmul *cudadrv.Function
}

// NewDense prepares dense.cu's kernels for the context's device; the module
// loads at the first launch.
func NewDense(ctx *cudadrv.Context) (*Dense, error) {
	k := &Dense{}
	err := k.prepareLookup(ctx, "dense", map[string]**cudadrv.Function{
		"dense_matmul_f32":     &k.matmul,
		"dense_matmul_f32_t8":  &k.matmulT8,
		"dense_get_rows_f32":   &k.getRows,
		"dense_moe_matmul_f32": &k.moeMatmul,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadDense is NewDense with the module loaded now.
func LoadDense(ctx *cudadrv.Context) (*Dense, error) { return loadNow(NewDense(ctx)) }

// denseWarps is the warps per block of the products (one output row each).
const denseWarps = 4

func denseGrid(warps int) cudadrv.Dim3 {
	return cudadrv.D1(max(1, min(cudadrv.Blocks(warps, denseWarps), 1<<16)))
}

// MatMul queues out[t*ldOut + r] = W[r]·x[t] for r < rows, t < nTok: W is
// [rows][cols] float, x [nTok][cols].
func (k *Dense) MatMul(s *cudadrv.Stream, out, w, x cudadrv.DevicePtr, rows, cols, nTok, ldOut int) error {
	if rows == 0 || nTok == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.matmul, s, denseGrid(rows), cudadrv.D1(32*denseWarps), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(w).Ptr(x).I32(int32(rows)).I32(int32(cols)).I32(int32(nTok)).I32(int32(ldOut))
	})
}

// denseTokenTile is dense_matmul_f32_t8's tokens per warp.
const denseTokenTile = 8

// MatMulTiled queues MatMul's product (float32, the same values up to the
// order of the additions) with each warp taking its row for 8 tokens at a
// time: fast enough for many tokens of a small matrix, the MoE router's
// product at prefill. nTok is at most 65535*8.
func (k *Dense) MatMulTiled(s *cudadrv.Stream, out, w, x cudadrv.DevicePtr, rows, cols, nTok, ldOut int) error {
	if rows == 0 || nTok == 0 {
		return nil
	}
	if nTok > 65535*denseTokenTile {
		return fmt.Errorf("kernels: tiled float32 product of %d tokens: at most %d", nTok, 65535*denseTokenTile)
	}
	if err := k.ready(); err != nil {
		return err
	}
	grid := cudadrv.Dim3{X: uint32(cudadrv.Blocks(rows, 2*denseWarps)), Y: uint32(cudadrv.Blocks(nTok, denseTokenTile)), Z: 1}
	return launch(k.matmulT8, s, grid, cudadrv.D1(32*2*denseWarps), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(w).Ptr(x).I32(int32(rows)).I32(int32(cols)).I32(int32(nTok)).I32(int32(ldOut))
	})
}

// GetRows queues out[t] = W[ids[t]] for t < nTok (ids: device int32).
func (k *Dense) GetRows(s *cudadrv.Stream, out, w, ids cudadrv.DevicePtr, cols, nTok int) error {
	n := cols * nTok
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.getRows, s, grid1(n, 256), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(w).Ptr(ids).I32(int32(cols)).I32(int32(nTok))
	})
}

// MoEMatMul queues, for each token t and slot j < topK with expert
// e = ids[t*topK+j], out[(t*topK+j)*rows + r] = W[e][r]·x', where x' is
// x[t] or, with perSlot, x[t*topK+j]. W is [experts][rows][cols] float.
func (k *Dense) MoEMatMul(s *cudadrv.Stream, out, w, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, rows, cols, nTok, topK int) error {
	n := nTok * topK * rows
	if n == 0 {
		return nil
	}
	ps := int32(0)
	if perSlot {
		ps = 1
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.moeMatmul, s, denseGrid(n), cudadrv.D1(32*denseWarps), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(w).Ptr(x).I32(ps).Ptr(ids).I32(int32(rows)).I32(int32(cols)).I32(int32(nTok)).I32(int32(topK))
	})
}
