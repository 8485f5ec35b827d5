package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/placement"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"
)

// placementFlags are the flags of every command that runs a model: where
// it computes, the VRAM budget, a placement to use instead of planning,
// and what the planner optimises for.
type placementFlags struct {
	backend   string
	budget    string
	placement string
	planFor   string
	dynamic   bool
	trace     string
	// cacheK and cacheV are the KV cache's types (llama.cpp's -ctk, -ctv).
	cacheK, cacheV string
	flags          *pflag.FlagSet // register's: which flags were given
}

func (p *placementFlags) register(f *pflag.FlagSet) {
	p.flags = f
	f.StringVar(&p.backend, "backend", executor.BackendAuto,
		"cpu, gpu (every op on the GPU) or auto (the GPU when usable: the whole model when it fits --vram-budget, else a measured CPU+GPU placement)")
	f.StringVar(&p.budget, "vram-budget", "",
		"GPU memory ats may use for weights, KV cache and buffers, e.g. 4.5GiB or 800MiB (default: the free memory less a margin; 0: CPU only)")
	f.StringVar(&p.placement, "placement", "", "place units as the JSON `FILE` says (what ats plan --json prints, possibly edited) instead of planning")
	f.StringVar(&p.planFor, "plan-for", "decode", "what the placement is optimised for: decode or prefill")
	f.BoolVar(&p.dynamic, "dynamic", true, "promote CPU tensors to the GPU for each decode step as the machine's load allows (false: the static placement only)")
	f.StringVar(&p.trace, "trace", "", "write a Chrome/Perfetto trace of the CPU work, the GPU compute stream and the copy stream of every batch to this file")
	f.StringVar(&p.cacheK, "cache-type-k", "f16", "KV cache type of the keys: f16, q8_0, q4_0 or f32 (CPU only); the values take the same")
	f.StringVar(&p.cacheV, "cache-type-v", "f16", "KV cache type of the values: as --cache-type-k, which it must equal")
}

// kvType is the cache type the two flags name: ats keeps keys and values
// in one type, so they must agree; one given alone sets both, and alone
// says so.
func (p *placementFlags) kvType() (t kvcache.Type, alone string, err error) {
	k, v := cmp.Or(p.cacheK, "f16"), cmp.Or(p.cacheV, "f16")
	if p.flags != nil {
		switch kSet, vSet := p.flags.Changed("cache-type-k"), p.flags.Changed("cache-type-v"); {
		case kSet && !vSet:
			v, alone = k, "--cache-type-k"
		case vSet && !kSet:
			k, alone = v, "--cache-type-v"
		}
	}
	tk, err := kvcache.ParseType(k)
	if err != nil {
		return 0, "", fmt.Errorf("--cache-type-k: %w", err)
	}
	tv, err := kvcache.ParseType(v)
	if err != nil {
		return 0, "", fmt.Errorf("--cache-type-v: %w", err)
	}
	if tk != tv {
		return 0, "", fmt.Errorf("--cache-type-k %s and --cache-type-v %s differ: ats keeps keys and values in one type; give one of them, or both the same", tk, tv)
	}
	return tk, alone, nil
}

// apply sets the placement fields of o, the environment's switches, the
// notes (to stderr) and the GPU (opened here, once, when the backend may
// use it); stderr (when not nil) also shows the profiling run that
// planning may need.
func (p *placementFlags) apply(o *session.Options, stderr io.Writer) error {
	envOptions(o)
	if stderr != nil {
		o.Notes = notes(stderr)
	} else {
		o.Notes = notes(os.Stderr)
	}
	for _, n := range envIgnored() {
		o.Notes.Note(n)
	}
	switch p.backend {
	case executor.BackendCPU, executor.BackendGPU, executor.BackendAuto:
	default:
		return fmt.Errorf("--backend %q: want cpu, gpu or auto", p.backend)
	}
	o.Backend = p.backend
	kt, alone, err := p.kvType()
	if err != nil {
		return err
	}
	if alone != "" && kt != kvcache.F16 {
		o.Notes.Note(fmt.Sprintf("%s %s: the keys and the values both take %s (ats keeps them in one type)", alone, kt, kt))
	}
	o.KVType = kt
	switch p.planFor {
	case "decode", "prefill":
		o.PlanFor = p.planFor
	default:
		return fmt.Errorf("--plan-for %q: want decode or prefill", p.planFor)
	}
	if p.budget != "" {
		b, err := parseSize(p.budget)
		if err != nil {
			return fmt.Errorf("--vram-budget: %w", err)
		}
		if b == 0 {
			if p.backend == executor.BackendGPU || p.placement != "" {
				return fmt.Errorf("--vram-budget 0 leaves nothing for the GPU, but --backend gpu or --placement asks for it")
			}
			o.Backend = executor.BackendCPU
		}
		o.VRAMBudget = b
	}
	if p.placement != "" {
		pl, err := placement.ReadPlacement(p.placement)
		if err != nil {
			return fmt.Errorf("--placement: %w", err)
		}
		if p.backend == executor.BackendCPU {
			return fmt.Errorf("--placement needs the GPU; --backend cpu runs without it")
		}
		o.Placement = pl
	}
	o.StaticOnly = !p.dynamic
	if p.trace != "" {
		t, err := openTrace(p.trace)
		if err != nil {
			return err
		}
		o.Trace = t
	}
	if stderr != nil {
		o.Progress = profileProgress(stderr)
	}
	dev, err := openDevice(o.Backend, o.Notes)
	if err != nil {
		return err
	}
	o.Device = dev
	return nil
}

// parseSize reads a byte size: a number with an optional unit, binary
// (KiB, MiB, GiB, TiB, and K, M, G, T alone) or decimal (KB, MB, GB, TB).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("%q is not a size (say 4.5GiB, 800MiB or a number of bytes)", s)
	}
	mult := map[string]float64{
		"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q (say B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)", s, t[i:])
	}
	b := v * mult
	if math.IsInf(b, 0) || b >= 1<<62 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(b), nil
}

// profileProgress shows a profiling run: a bar on a terminal, a line at
// the start and the end otherwise.
func profileProgress(w io.Writer) func(done, total int, what string) {
	return progressSaying(w, "ats: measuring this model's units on the CPU and the GPU for the placement (once; the profile is cached)")
}

// progressSaying is profileProgress with another first line.
func progressSaying(w io.Writer, first string) func(done, total int, what string) {
	var once sync.Once
	var bar *progressbar.ProgressBar
	var start time.Time
	return func(done, total int, what string) {
		once.Do(func() {
			start = time.Now()
			fmt.Fprintln(w, first)
			if isTerminal(w) {
				bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("profiling"),
					progressbar.OptionSetWidth(30), progressbar.OptionThrottle(50*time.Millisecond), progressbar.OptionClearOnFinish(),
					progressbar.OptionShowCount())
			}
		})
		if bar != nil {
			bar.Describe("profiling " + what)
			bar.Set(done)
		}
		if done == total {
			if bar != nil {
				bar.Finish()
			}
			fmt.Fprintf(w, "ats: profiled %d measurements in %.1fs\n", total, time.Since(start).Seconds())
		}
	}
}

// traces are the trace files of this run by path: every context of a
// command (bench makes several) writes into the same one.
var traces = map[string]*executor.Trace{}

func openTrace(path string) (*executor.Trace, error) {
	if t := traces[path]; t != nil {
		return t, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	t := executor.NewTrace(f)
	traces[path] = t
	atExit(func() {
		if err := errors.Join(t.Close(), f.Close()); err != nil {
			fmt.Fprintln(os.Stderr, "ats: --trace:", err)
		}
	})
	return t, nil
}
