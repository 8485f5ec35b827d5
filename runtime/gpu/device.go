// Package gpu is the CUDA backend of the executor: device memory for the
// resident weights, the activation buffers and the KV caches of the layers
// whose attention runs on the GPU; a staging ring through which other
// weights stream; and the program's ops compiled, segment by segment, into
// fused kernel launches (compile.go) run on a compute stream, with weight
// copies on a copy stream (exec.go). It executes; it never decides: which
// op runs where and which weight is resident come from the executor
// (runtime/exec.go) and the planner.
package gpu

import (
	"fmt"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
)

// Device is the process's view of device 0: its primary context and the
// kernel sets, each of which loads its module at its first launch (a dense
// model never loads the MoE routing). It is made once and kept: the driver
// frees everything at exit, and the modules are small.
type Device struct {
	ctx  *cudadrv.Context
	info cudadrv.DeviceInfo

	norm *kernels.Norm
	rope *kernels.Rope
	attn *kernels.Attention
	moe  *kernels.MoERoute
	glu  *kernels.GLU
	elem *kernels.Elementwise
	util *kernels.Util
	w    WeightOps // the weight kernels contexts use
	ref  WeightOps // the float32 reference weight kernels
	// dense is ref's float32 kernels, which also take the MoE router's
	// float32 product at prefill (compile.go: routerLogits).
	dense *kernels.Dense
	// contextBytes is what NVML charged the process once the context and
	// the modules were loaded, before any allocation of ats (0 without
	// NVML): the CUDA context's own memory, reported apart from budgets.
	contextBytes int64
}

var sharedGPU struct {
	once sync.Once
	dev  *Device
	err  error
}

// Open returns the shared device 0, opening it on first use. Its error
// wraps cudadrv.ErrUnavailable when there is no driver or device.
func Open() (*Device, error) {
	sharedGPU.once.Do(func() { sharedGPU.dev, sharedGPU.err = newDevice() })
	return sharedGPU.dev, sharedGPU.err
}

func newDevice() (*Device, error) {
	if err := cudadrv.Init(); err != nil {
		return nil, err
	}
	d, err := cudadrv.GetDevice(0)
	if err != nil {
		return nil, err
	}
	g := &Device{}
	if g.info, err = d.Info(); err != nil {
		return nil, fmt.Errorf("gpu: device 0: %w", err)
	}
	if g.ctx, err = d.RetainPrimaryContext(); err != nil {
		return nil, fmt.Errorf("gpu: device 0 (%s): %w", g.info.Name, err)
	}
	load := func(name string, f func() error) {
		if err == nil {
			if e := f(); e != nil {
				err = fmt.Errorf("gpu: loading the %s kernels: %w", name, e)
			}
		}
	}
	load("norm", func() (e error) { g.norm, e = kernels.NewNorm(g.ctx); return })
	load("rope", func() (e error) { g.rope, e = kernels.NewRope(g.ctx); return })
	load("attention", func() (e error) { g.attn, e = kernels.NewAttention(g.ctx); return })
	load("moe routing", func() (e error) { g.moe, e = kernels.NewMoERoute(g.ctx); return })
	load("glu", func() (e error) { g.glu, e = kernels.NewGLU(g.ctx); return })
	load("elementwise", func() (e error) { g.elem, e = kernels.NewElementwise(g.ctx); return })
	load("util", func() (e error) { g.util, e = kernels.NewUtil(g.ctx); return })
	load("weight", func() (e error) { g.w, g.ref, e = loadWeightOps(g.ctx, g.info); return })
	if err != nil {
		return nil, err
	}
	g.dense = g.ref.(*refWeightOps).k
	g.contextBytes, _, _ = g.ProcessMemory()
	return g, nil
}

// Info describes the device.
func (d *Device) Info() cudadrv.DeviceInfo { return d.info }

// Context is the device's primary context.
func (d *Device) Context() *cudadrv.Context { return d.ctx }

// MemInfo is the device memory free and in total, in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	f, t, err := d.ctx.MemInfo()
	return int64(f), int64(t), err
}

// WeightsOverride, when set (by tests), replaces the device's weight
// kernels for new Execs.
var WeightsOverride WeightOps

// Weights returns the weight kernels a new Exec uses.
func (d *Device) Weights() WeightOps {
	if WeightsOverride != nil {
		return WeightsOverride
	}
	return d.w
}

// Reference returns the float32 reference weight kernels (for tests).
func (d *Device) Reference() WeightOps { return d.ref }

// ContextBytes is the device memory of the CUDA context and kernel modules
// (NVML, before ats allocated anything; 0 without NVML).
func (d *Device) ContextBytes() int64 { return d.contextBytes }

// loadModules loads every kernel module a program needs now rather than at
// its first launch: a module load inside a graph capture is not allowed by
// every driver, so the first decode capture calls this before it starts.
func (d *Device) loadModules(moe bool) error {
	sets := []interface{ Load() error }{d.norm, d.rope, d.attn, d.glu, d.elem, d.util}
	if moe {
		sets = append(sets, d.moe)
	}
	for _, s := range sets {
		if err := s.Load(); err != nil {
			return err
		}
	}
	return nil
}
