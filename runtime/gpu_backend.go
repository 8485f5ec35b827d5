package runtime

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
)

// The GPU backend. A context made with Backend "gpu" keeps every weight,
// activation buffer and the KV cache in device memory and runs the
// program's ops as kernels on one stream (gpu_exec.go, gpu_compile.go).
// The weights are uploaded once per model and shared by its GPU contexts
// (gpu_weights.go).
//
// The backend executes; it never decides. Which op runs where is an input
// (gpuExec.place, all GPU for now) so that the planner's per-tensor
// placement can plug in later without touching the kernels' side.

// Backends a context can run on (ContextOptions.Backend).
const (
	BackendCPU  = "cpu"
	BackendGPU  = "gpu"
	BackendAuto = "auto"
)

// gpuDevice is the process's view of device 0: its primary context and the
// kernel sets, each of which loads its module at its first launch (a dense
// model never loads the MoE routing). It is made once and kept: the driver
// frees everything at exit, and the modules are small.
type gpuDevice struct {
	ctx  *cudadrv.Context
	info cudadrv.DeviceInfo

	norm *kernels.Norm
	rope *kernels.Rope
	attn *kernels.Attention
	moe  *kernels.MoERoute
	glu  *kernels.GLU
	elem *kernels.Elementwise
	util *kernels.Util
	w    gpuWeightOps // the weight kernels contexts use
	ref  gpuWeightOps // the float32 reference weight kernels
}

var sharedGPU struct {
	once sync.Once
	dev  *gpuDevice
	err  error
}

// openGPU returns the shared device, opening it on first use. Its error
// wraps cudadrv.ErrUnavailable when there is no driver or device.
func openGPU() (*gpuDevice, error) {
	sharedGPU.once.Do(func() { sharedGPU.dev, sharedGPU.err = newGPUDevice() })
	return sharedGPU.dev, sharedGPU.err
}

func newGPUDevice() (*gpuDevice, error) {
	if err := cudadrv.Init(); err != nil {
		return nil, err
	}
	d, err := cudadrv.GetDevice(0)
	if err != nil {
		return nil, err
	}
	g := &gpuDevice{}
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
	return g, nil
}

// gpuWeightsOverride, when set (by tests), replaces the device's weight
// kernels for new contexts.
var gpuWeightsOverride gpuWeightOps

// weights returns the weight kernels for a new context.
func (d *gpuDevice) weights() gpuWeightOps {
	if gpuWeightsOverride != nil {
		return gpuWeightsOverride
	}
	return d.w
}

// cpuNoteOnce makes "running on the CPU" said once per process.
var cpuNoteOnce sync.Once

// noteCPU tells the user once, on stderr, that ats computes on the CPU and why.
func noteCPU(reason string) {
	cpuNoteOnce.Do(func() { fmt.Fprintf(os.Stderr, "ats: running on the CPU: %s\n", reason) })
}

// newBackend returns the GPU executor for a context with options opt
// (CtxSize and Batch resolved), or nil when the context runs on the CPU.
func (m *Model) newBackend(opt ContextOptions) (*gpuExec, error) {
	switch opt.Backend {
	case "", BackendCPU:
		return nil, nil
	case BackendGPU:
		if opt.KVF32 {
			return nil, errors.New("backend gpu: the GPU keeps the KV cache in f16; an f32 cache needs the CPU backend")
		}
		dev, err := openGPU()
		if err != nil {
			return nil, fmt.Errorf("backend gpu: %w", err)
		}
		return newGPUExec(dev, dev.weights(), m, opt)
	case BackendAuto:
		if opt.KVF32 {
			noteCPU("an f32 KV cache is kept on the CPU only")
			return nil, nil
		}
		dev, err := openGPU()
		if err != nil {
			noteCPU(err.Error())
			return nil, nil
		}
		need := gpuMemoryNeed(dev, m, opt)
		free, _, err := dev.ctx.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("gpu: %w", err)
		}
		// Leave room for the driver, the modules and other processes.
		if avail := int64(free) - int64(free)/16 - 256<<20; need > avail {
			noteCPU(fmt.Sprintf("the model needs %.1f GiB on the GPU, %.1f GiB of %s's memory is free",
				float64(need)/(1<<30), float64(free)/(1<<30), dev.info.Name))
			return nil, nil
		}
		g, err := newGPUExec(dev, dev.weights(), m, opt)
		if errors.Is(err, cudadrv.ErrorOutOfMemory) {
			noteCPU(err.Error())
			return nil, nil
		}
		return g, err
	default:
		return nil, fmt.Errorf("backend %q: want cpu, gpu or auto", opt.Backend)
	}
}

// Backend says where the context computes: "cpu" or "gpu".
func (c *Context) Backend() string {
	if c.gpu != nil {
		return BackendGPU
	}
	return BackendCPU
}
