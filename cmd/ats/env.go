package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/session"
)

// The engine's switches for measurements and debugging. The command line
// reads them here, once, into the engine's options; nothing below cmd/ats
// reads the environment.
const (
	envRepack       = "ATS_REPACK"          // "0": the CPU computes from the file's blocks, no repacked copies; "all": a hybrid's host matrices all repacked
	envCPUProfile   = "ATS_CPU_OPS_PROFILE" // "1": time every CPU op, report at the end
	envGPUProfile   = "ATS_GPU_PROFILE"     // "1": time every GPU launch group, report at the end
	envGPUGraphs    = "ATS_GPU_GRAPHS"      // "0": no CUDA graphs for decode steps
	envGPUPrefetch  = "ATS_GPU_PREFETCH"    // "0": no prefetch of the next decode step's streamed weights
	envGPUPDL       = "ATS_GPU_PDL"         // "0": no programmatic dependent launch
	envGPUSpin      = "ATS_GPU_SPIN_SYNC"   // "0": wait in the driver instead of polling
	envGPURegister  = "ATS_GPU_REGISTER"    // "0": never page-lock the model file
	envGPUWeights   = "ATS_GPU_WEIGHTS"     // "ref": the float32 reference weight kernels
	envGPUDecodeMMA = "ATS_GPU_DECODE_MMA"  // fewest decode rows whose Q4_K/Q6_K products take the tensor cores ("0": never)
	envMoESplit     = "ATS_MOE_SPLIT"       // how prompt batches split streamed MoE layers with the CPU
	envMoERouted    = "ATS_MOE_ROUTED"      // the GPU's share of a decode step's chosen experts of the CPU's MoE layers ("0": none; a fraction: held; auto: the two sides keep pace)
	envPromoteLog   = "ATS_PROMOTE_LOG"     // "1": a line per decode step the promoter observes
)

// envValues are the values of the switches that take a fixed few (the
// MoE shares and ATS_GPU_DECODE_MMA are checked where they are read).
var envValues = map[string][]string{
	envRepack: {"0", "all"}, envCPUProfile: {"1"}, envGPUProfile: {"1"}, envGPUGraphs: {"0"},
	envGPUPrefetch: {"0"}, envGPUPDL: {"0"}, envGPUSpin: {"0"}, envGPURegister: {"0"},
	envGPUWeights: {"ref"}, envPromoteLog: {"1"},
}

// envIgnored says which switches the environment sets to a value they do
// not take, and are therefore off: one line each, in name order.
func envIgnored() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(envValues)) {
		if v, ok := os.LookupEnv(k); ok && v != "" && !slices.Contains(envValues[k], v) {
			out = append(out, fmt.Sprintf("%s=%q is not one of %s: ignored", k, v, strings.Join(envValues[k], ", ")))
		}
	}
	return out
}

// envOptions sets the switches the environment asks for in o; those set
// to a value they do not take are off (envIgnored).
func envOptions(o *session.Options) {
	o.NoRepack = os.Getenv(envRepack) == "0"
	o.RepackAll = os.Getenv(envRepack) == "all"
	o.HostProfile = os.Getenv(envCPUProfile) == "1"
	o.MoESplit = os.Getenv(envMoESplit)
	o.MoERouted = os.Getenv(envMoERouted)
	o.PromoteLog = os.Getenv(envPromoteLog) == "1"
	o.DeviceOptions = backend.Options{
		Profile:    os.Getenv(envGPUProfile) == "1",
		NoGraphs:   os.Getenv(envGPUGraphs) == "0",
		NoPrefetch: os.Getenv(envGPUPrefetch) == "0",
		NoPDL:      os.Getenv(envGPUPDL) == "0",
		NoSpinSync: os.Getenv(envGPUSpin) == "0",
		NoRegister: os.Getenv(envGPURegister) == "0",
		Weights:    os.Getenv(envGPUWeights),
		DecodeMMA:  os.Getenv(envGPUDecodeMMA),
	}
}

// notes is where the engine's notes go: stderr, each said once.
func notes(w io.Writer) backend.Notes {
	var mu sync.Mutex
	said := map[string]bool{}
	return func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if said[s] {
			return
		}
		said[s] = true
		for _, line := range strings.Split(s, "\n") {
			fmt.Fprintln(w, "ats: "+line)
		}
	}
}

// device is the process's GPU: opened once, by the command line, and
// handed to the engine.
var device struct {
	once sync.Once
	dev  *cuda.Device
	err  error
}

// openDevice opens the GPU for backend (cpu: none). Without a usable GPU,
// auto runs on the CPU, saying why once; gpu is an error.
func openDevice(backendName string, note backend.Notes) (backend.Accelerator, error) {
	if backendName == "" || backendName == executor.BackendCPU {
		return nil, nil
	}
	device.once.Do(func() { device.dev, device.err = cuda.Open(0) })
	if device.err != nil {
		if backendName == executor.BackendGPU {
			return nil, fmt.Errorf("backend gpu: %w", device.err)
		}
		note.Note("running on the CPU: " + device.err.Error())
		return nil, nil
	}
	return device.dev, nil
}
