// Package cuda is the CUDA backend of the executor: device memory for the
// resident weights, the activation buffers and the KV caches of the layers
// whose attention runs on the GPU; a staging ring through which other
// weights stream; and the program's ops compiled, segment by segment, into
// fused kernel launches (compile.go, op_<kind>.go) run on a compute stream,
// with weight copies on a copy stream (exec.go). It executes; it never
// decides: which op runs where and which weight is resident come from the
// executor (runtime/exec) and the planner (runtime/placement), through the
// interfaces of runtime/backend, which Device and Exec implement.
package cuda

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// Device is one CUDA device: its primary context and the kernel sets, each
// of which loads its module at its first launch (a dense model never loads
// the MoE routing). It is opened once per process, by whoever owns the
// device, and kept: the driver frees everything at exit.
type Device struct {
	ordinal int
	ctx     *cudadrv.Context
	info    cudadrv.DeviceInfo

	norm *kernels.Norm
	rope *kernels.Rope
	attn *kernels.Attention
	moe  *kernels.MoERoute
	glu  *kernels.GLU
	elem *kernels.Elementwise
	util *kernels.Util
	w    WeightOps // the quantized weight kernels (nil: they failed to load, quantWhy)
	ref  WeightOps // the float32 reference weight kernels
	// quantWhy is why the quantized kernels did not load.
	quantWhy error
	// dense is ref's float32 kernels, which also take the MoE router's
	// float32 product at prefill (compile.go: routerLogits).
	dense *kernels.Dense
	// contextBytes is what NVML charged the process once the context and
	// the modules were loaded, before any allocation of ats (0 without
	// NVML): the CUDA context's own memory, reported apart from budgets.
	contextBytes  int64
	quantNote     sync.Once
	decodeMMANote sync.Once // a bad DecodeMMA said once
}

var devices struct {
	sync.Mutex
	open map[int]*Device
}

// Open opens device ordinal (its primary context and kernel sets). Opening
// a device twice in a process gives the same Device. Its error wraps
// cudadrv.ErrUnavailable when there is no driver or no such device.
func Open(ordinal int) (*Device, error) {
	devices.Lock()
	defer devices.Unlock()
	if d := devices.open[ordinal]; d != nil {
		return d, nil
	}
	d, err := newDevice(ordinal)
	if err != nil {
		return nil, err
	}
	if devices.open == nil {
		devices.open = map[int]*Device{}
	}
	devices.open[ordinal] = d
	return d, nil
}

func newDevice(ordinal int) (*Device, error) {
	if err := cudadrv.Init(); err != nil {
		return nil, err
	}
	d, err := cudadrv.GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	g := &Device{ordinal: ordinal}
	if g.info, err = d.Info(); err != nil {
		return nil, fmt.Errorf("gpu: device %d: %w", ordinal, err)
	}
	if g.ctx, err = d.RetainPrimaryContext(); err != nil {
		return nil, fmt.Errorf("gpu: device %d (%s): %w", ordinal, g.info.Name, err)
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
	load("weight", func() (e error) { g.w, g.ref, g.quantWhy, e = loadWeightOps(g.ctx); return })
	if err != nil {
		return nil, err
	}
	g.dense = g.ref.(*refWeightOps).k
	g.contextBytes, _, _ = g.ProcessMemory()
	return g, nil
}

// Name is the device's name.
func (d *Device) Name() string { return d.info.Name }

// CUDAInfo describes the device as the driver reports it.
func (d *Device) CUDAInfo() cudadrv.DeviceInfo { return d.info }

// Info are the device's figures the planner keys profiles by.
func (d *Device) Info() backend.DeviceInfo {
	bi := backend.DeviceInfo{Name: d.info.Name, Memory: int64(d.info.TotalMem), L2Cache: int64(d.info.L2CacheBytes),
		Compute: fmt.Sprintf("%d.%d", d.info.Major, d.info.Minor), Identity: d.info.PCIBusID}
	if v, err := cudadrv.DriverVersion(); err == nil {
		bi.Driver = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	return bi
}

// Context is the device's primary context.
func (d *Device) Context() *cudadrv.Context { return d.ctx }

// MemInfo is the device memory free and in total, in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	f, t, err := d.ctx.MemInfo()
	return int64(f), int64(t), err
}

// Weights returns the weight kernels an Exec with options opt uses: the
// quantized kernels, or the float32 reference ones when opt asks for them
// ("ref") or the quantized ones failed to load (said once to opt.Notes).
func (d *Device) Weights(opt backend.Options) WeightOps {
	if opt.Weights == "ref" {
		return d.ref
	}
	if d.w == nil {
		d.quantNote.Do(func() {
			opt.Notes.Note(fmt.Sprintf("the GPU weight kernels failed to load (%v); using the float32 reference kernels", d.quantWhy))
		})
		return d.ref
	}
	if opt.DecodeMMA != "" {
		q := d.w.(*quantOps)
		n, err := strconv.Atoi(opt.DecodeMMA)
		if err != nil || n < 0 {
			d.decodeMMANote.Do(func() {
				opt.Notes.Note(fmt.Sprintf("ATS_GPU_DECODE_MMA=%q is not a count of decode rows (0: off): ignored", opt.DecodeMMA))
			})
			n = -1
		}
		q.k.SetDecodeMMA(n)
	}
	return d.w
}

// Reference returns the float32 reference weight kernels (for tests).
func (d *Device) Reference() WeightOps { return d.ref }

// DeviceBytes is the device memory weight w takes in the quantized
// kernels' format (the weights an Exec with default options uploads).
func (d *Device) DeviceBytes(w *ir.Weight) int64 { return d.Weights(backend.Options{}).DeviceBytes(w) }

// SplitsMoE says whether the device's weight kernels can split an expert
// layer with the host.
func (d *Device) SplitsMoE() bool { return SplitsMoE(d.Weights(backend.Options{})) }

// SupportsKV says which cache types the attention kernels read: f16, q8_0
// and q4_0 (ggml's blocks, as llama.cpp's -ctk q8_0 and q4_0).
func (d *Device) SupportsKV(t kvcache.Type) bool {
	_, ok := kernelKVType(t)
	return ok
}

// kernelKVType is the kernels' name for a cache type, and whether they
// have one.
func kernelKVType(t kvcache.Type) (kernels.KVType, bool) {
	switch t {
	case kvcache.F16:
		return kernels.KVF16, true
	case kvcache.Q8_0:
		return kernels.KVQ8_0, true
	case kvcache.Q4_0:
		return kernels.KVQ4_0, true
	}
	return 0, false
}

// MultiSequence says whether a step may hold several sequences: the paged
// kernels read every token's cells through its sequence's block table.
func (d *Device) MultiSequence() bool { return true }

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

var _ backend.Accelerator = (*Device)(nil)
var _ backend.Exec = (*Exec)(nil)
