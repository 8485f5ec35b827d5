package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/gpu"
	"github.com/atsinfer/ats/runtime/ir"
)

// Limits on the options of a context (issue 13): every size a flag can set
// is checked before anything is allocated, so `-c 100000000` is an error
// that says how much memory it would take, not a fatal out-of-memory.

// MaxCtxSize is the largest context ats accepts, whatever the memory: no
// model is trained on more, and sizes computed from it stay far from
// overflowing.
const MaxCtxSize = 1 << 24

// maxThreads bounds ContextOptions.Threads: a few times the CPUs, so that a
// thread sweep in a benchmark still runs on a small machine, but never
// thousands of spinning workers.
func maxThreads() int { return 4 * goruntime.NumCPU() }

// checkContextOptions reports what is wrong with opt (CtxSize and Batch
// resolved) for model m.
func checkContextOptions(m *Model, opt ContextOptions) error {
	h := m.Prog.Hyper
	switch {
	case opt.CtxSize < 0:
		return fmt.Errorf("context size %d is negative", opt.CtxSize)
	case opt.Threads < 0:
		return fmt.Errorf("thread count %d is negative (0: all cores)", opt.Threads)
	case opt.Threads > maxThreads():
		return fmt.Errorf("%d threads asked for, but this machine has %d CPUs; at most %d are allowed, and more threads than CPUs only slow the kernels down (0: all cores)", opt.Threads, goruntime.NumCPU(), maxThreads())
	case opt.Batch < 0:
		return fmt.Errorf("batch size %d is negative", opt.Batch)
	}
	need := contextBytes(h, opt)
	if opt.Backend == "" || opt.Backend == BackendCPU || opt.Backend == BackendAuto && !fitsGPU(m, opt) {
		if avail, ok := availableMemory(); ok && need > avail {
			return fmt.Errorf("a context of %d tokens needs %s of memory for its KV cache and buffers, but only %s is available; use a smaller context (at most about %d tokens)",
				opt.CtxSize, gibibytes(need), gibibytes(avail), maxFittingCtx(h, opt, avail))
		}
	}
	if opt.CtxSize > MaxCtxSize {
		return fmt.Errorf("context size %d is more than ats supports (%d tokens; the model was trained on %d)", opt.CtxSize, MaxCtxSize, h.NCtxTrain)
	}
	return nil
}

// ContextWarnings returns what is allowed in opt but likely a mistake: a
// context longer than the model was trained on (without rope scaling the
// model degrades past it).
func ContextWarnings(h ir.Hyper, opt ContextOptions) []string {
	var w []string
	if opt.CtxSize > h.NCtxTrain && h.NCtxTrain > 0 {
		w = append(w, fmt.Sprintf("context size %d is more than the %d tokens the model was trained on; its answers may degrade past that", opt.CtxSize, h.NCtxTrain))
	}
	return w
}

// contextBytes estimates the host memory of a CPU context: the KV cache
// (keys and values of every layer, in the cache's type) and the activation
// buffers of one batch, logits included.
func contextBytes(h ir.Hyper, opt ContextOptions) int64 {
	width := int64(h.NKVHead) * int64(max(h.HeadK, h.HeadV))
	kv := 2 * int64(h.NLayer) * int64(opt.cacheType().RowBytes(int(width)))
	batch := int64(opt.Batch)
	if batch <= 0 {
		batch = 512
	}
	batch = min(batch, int64(max(opt.CtxSize, 1)))
	bufs := 4 * batch * (int64(h.NVocab) + 6*int64(h.NEmbd) + 3*int64(max(h.NFF, h.NFFExpert*max(h.NExpertUsed, 1))))
	return min(satMul(kv, int64(opt.CtxSize)), 1<<62) + bufs
}

// maxFittingCtx is about the largest context whose cache fits in avail.
func maxFittingCtx(h ir.Hyper, opt ContextOptions, avail int64) int {
	per := contextBytes(h, ContextOptions{CtxSize: 1, KVF32: opt.KVF32, KVType: opt.KVType, Batch: 1})
	fixed := contextBytes(h, ContextOptions{CtxSize: 0, KVF32: opt.KVF32, KVType: opt.KVType, Batch: opt.Batch}) - contextBytes(h, ContextOptions{CtxSize: 0, KVF32: opt.KVF32, KVType: opt.KVType, Batch: 1})
	n := (avail - fixed) / max(per, 1)
	// Round down to a multiple of 256, as context sizes usually are.
	return int(max(min(n, MaxCtxSize)/256*256, 0))
}

// fitsGPU reports whether the auto backend would put the context on the
// GPU (then host memory does not hold its cache).
func fitsGPU(m *Model, opt ContextOptions) bool {
	if opt.cacheType() != ops.KVF16 {
		return false
	}
	dev, err := gpu.Open()
	if err != nil {
		return false
	}
	budget, _, err := budgetFor(dev, opt)
	if err != nil {
		return false
	}
	all := newPlacement(m, programUnits(m.Prog, opt.CtxSize, dev.Weights().DeviceBytes), BackendGPU)
	arena, weights := m.needBytes(dev, all, opt)
	return arena+weights <= budget
}

func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

func gibibytes(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// availableMemory is the memory a new allocation can take without
// swapping or the process being killed: MemAvailable, or less when a
// cgroup limits the process. ok is false where it cannot be read (outside
// Linux), and then nothing is checked against it.
func availableMemory() (avail int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, false
			}
			avail, ok = kb<<10, true
		}
	}
	if !ok {
		return 0, false
	}
	if limit, used, ok := cgroupMemory(); ok && limit-used < avail {
		avail = max(limit-used, 0)
	}
	return avail, true
}

// cgroupMemory reads the memory limit and usage of the process's cgroup
// (v2, or v1's memory controller).
func cgroupMemory() (limit, used int64, ok bool) {
	read := func(path string) (int64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false
		}
		v, err := strconv.ParseInt(s, 10, 64)
		// v1 reports "no limit" as a huge number.
		return v, err == nil && v < 1<<60
	}
	if l, ok := read("/sys/fs/cgroup/memory.max"); ok {
		u, _ := read("/sys/fs/cgroup/memory.current")
		return l, u, true
	}
	if l, ok := read("/sys/fs/cgroup/memory/memory.limit_in_bytes"); ok {
		u, _ := read("/sys/fs/cgroup/memory/memory.usage_in_bytes")
		return l, u, true
	}
	return 0, 0, false
}
