package session

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// longOracle is the layout of testdata/oracle/long/*.logits.json: the
// short oracles' fields, with prefill_logits holding only the rows of
// the prompt's last tokens, from prefill_from on.
type longOracle struct {
	oracleLogits
	PrefillFrom int    `json:"prefill_from"`
	NCtx        int    `json:"n_ctx"`
	KV          string `json:"kv"`
}

// eachLongOracle calls f with every long oracle: its name, the model it
// was made from, and the file's contents with the cache type it names.
func eachLongOracle(t *testing.T, f func(t *testing.T, name string, m *model.Model, want *longOracle, kt kvcache.Type)) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "long", "*.logits.json"))
	if len(files) == 0 {
		t.Fatalf("no long oracles in %s", filepath.Join(dir, "long"))
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".logits.json")
		base := strings.TrimSuffix(strings.TrimSuffix(name, "-kvq8"), "-long")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var want longOracle
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			kt, err := kvcache.ParseType(want.KV)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			m, err := model.Open(filepath.Join(dir, base+".gguf"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			f(t, base, m, &want, kt)
		})
	}
}

// checkLongOracle runs a long oracle on an engine of opt (its context and
// cache type set here): the prompt up to the oracle's rows, its last rows
// with their logits, then each decode step with the oracle's token fed in
// (teacher forcing). It fails over the short oracles' bounds.
func checkLongOracle(t *testing.T, name string, m *model.Model, want *longOracle, kt kvcache.Type, opt Options) {
	t.Helper()
	checkLongOracleWith(t, name, m, want, kt, opt, nil)
}

// checkLongOracleWith is checkLongOracle with setup called on the engine
// before the prompt (nil: none).
func checkLongOracleWith(t *testing.T, name string, m *model.Model, want *longOracle, kt kvcache.Type, opt Options, setup func(*Engine)) {
	t.Helper()
	opt.CtxSize, opt.KVType = want.NCtx, kt
	c, err := newCtx(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if setup != nil {
		setup(c.Engine)
	}
	if _, err := c.Eval(want.Prompt[:want.PrefillFrom], false); err != nil {
		t.Fatal(err)
	}
	last, err := c.Eval(want.Prompt[want.PrefillFrom:], true)
	if err != nil {
		t.Fatal(err)
	}
	var got, ref []float32
	got = append(got, last...)
	for _, r := range want.PrefillLogits {
		ref = append(ref, r...)
	}
	prefill := nmse(got, ref)
	for s, tok := range want.Generated {
		l, err := c.Eval([]int{tok}, false)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l...)
		ref = append(ref, want.DecodeLogits[s]...)
	}
	if len(got) != len(ref) {
		t.Fatalf("%d logits, oracle has %d", len(got), len(ref))
	}
	e, tol := nmse(got, ref), oracleTolerance(name)
	t.Logf("%s (%s cache, %s): NMSE %.3g (prompt rows %.3g; bound %.0e)", name, kt, c.Backend(), e, prefill, tol)
	checkOracleNMSE(t, name, fmt.Sprintf("%s (%s cache, %s)", name, kt, c.Backend()), c.Backend() != executor.BackendCPU, e, tol)
}

// TestLongOracles checks the CPU backend against llama.cpp's logits after
// a 3000-token prompt in a 4096 context, with the KV cache the file names
// (f16, or q8_0 for the -kvq8 files).
func TestLongOracles(t *testing.T) {
	eachLongOracle(t, func(t *testing.T, name string, m *model.Model, want *longOracle, kt kvcache.Type) {
		checkLongOracle(t, name, m, want, kt, Options{Threads: 2})
	})
}

// TestLongOraclesGPU is TestLongOracles on the GPU: every unit there, the
// attention alone on the CPU (its cache in host memory), and alternating
// layers. An MoE model's experts are the CPU backend's choice on every
// token, imposed on both backends (as TestOraclesGPUWithCPURouting; a
// hybrid's host layers see the GPU's rounding upstream): over 3000 tokens
// the GPU's own rounding flips a near-tie somewhere (the short oracles
// judge those rows apart), and a flipped token's keys and values then
// reach every later row; the logged count says how many it would flip.
func TestLongOraclesGPU(t *testing.T) {
	dev := needGPUDevice(t)
	eachLongOracle(t, func(t *testing.T, name string, m *model.Model, want *longOracle, kt kvcache.Type) {
		var setup func(*Engine)
		if len(moeOps(m.Prog)) > 0 {
			all := &oracleLogits{Prompt: want.Prompt, NVocab: want.NVocab, Generated: want.Generated}
			routes, _, _ := cpuOracleRoutesKV(t, m.File.Path, all, kt)
			setup = func(c *Engine) {
				own := inspectRoutes(t, c, len(want.Prompt)+len(want.Generated), routes)
				t.Cleanup(func() {
					flips, _ := routeFlips(routes, own)
					n := 0
					for _, f := range flips {
						if f.b.ids != nil { // routed in the run (the prompt's first rows need not be)
							n++
						}
					}
					t.Logf("the placement's own expert choice would differ from the CPU's at %d token x layer pairs", n)
				})
			}
		}
		attnCPU := forcedPlacement(t, m, want.NCtx, func(_ int, u model.Unit) bool { return u.Role != "attention" })
		half := forcedPlacement(t, m, want.NCtx, func(i int, _ model.Unit) bool { return i%2 == 1 })
		for _, v := range []struct {
			name string
			opt  Options
		}{
			{"all-gpu", Options{Backend: executor.BackendGPU}},
			{"attention-cpu", Options{Backend: executor.BackendAuto, Placement: attnCPU, PromoteEverything: true}},
			{"alternating", Options{Backend: executor.BackendAuto, Placement: half, PromoteEverything: true}},
		} {
			t.Run(v.name, func(t *testing.T) {
				v.opt.Device, v.opt.Threads = dev, 2
				checkLongOracleWith(t, name, m, want, kt, v.opt, setup)
			})
		}
	})
}
