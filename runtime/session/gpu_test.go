package session

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
)

// Whole-model tests of the GPU backend: every oracle with all tensors on
// the GPU, against llama.cpp's logits (the same bound as the CPU) and
// against the CPU backend; the decode graph against eager launches; a
// prompt in small batches against one batch. They skip without a GPU.

// needGPUDevice returns the process's device or skips the test.
func needGPUDevice(t testing.TB) *cuda.Device {
	t.Helper()
	if ok, reason := cudadrv.Available(); !ok {
		t.Skip("skipping GPU test: " + reason)
	}
	dev, err := cuda.Open(0)
	if errors.Is(err, cudadrv.ErrUnavailable) {
		t.Skip("skipping GPU test: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

type weightVariant struct {
	name string
	opt  backend.Options // its Weights
	w    cuda.WeightOps
}

// gpuWeightVariants lists the weight kernels to test with: the ones
// engines use, and the float32 reference when that is another.
func gpuWeightVariants(dev *cuda.Device) []weightVariant {
	v := []weightVariant{{"default", backend.Options{}, dev.Weights(backend.Options{})}}
	if ref := (backend.Options{Weights: "ref"}); dev.Weights(ref) != dev.Weights(backend.Options{}) {
		v = append(v, weightVariant{"ref", ref, dev.Weights(ref)})
	}
	return v
}

// onGPU is opt with every unit on dev.
func onGPU(dev *cuda.Device, opt Options) Options {
	opt.Backend, opt.Device = executor.BackendGPU, dev
	return opt
}

func oracleFiles(t *testing.T) []string {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no oracle models in %s", dir)
	}
	return files
}

// flatLogits joins prefill and decode logits in the oracle's order.
func flatLogits(prefill []float32, decode [][]float32) []float32 {
	out := append([]float32(nil), prefill...)
	for _, d := range decode {
		out = append(out, d...)
	}
	return out
}

// TestOraclesGPU checks every oracle model on the GPU against llama.cpp's
// logits with the oracle bound, and reports the distance to the CPU
// backend's logits. For MoE models it also reads back the GPU's expert
// choices and compares them with the CPU backend's: a token whose router
// probabilities are nearly tied may go to another expert on either
// backend (a routing flip), and its logits then differ by far more than
// rounding. Those models are judged on the rows of the tokens whose
// routing agrees in every layer; the NMSE of all rows is printed.
func TestOraclesGPU(t *testing.T) {
	dev := needGPUDevice(t)
	files := oracleFiles(t)
	for _, v := range gpuWeightVariants(dev) {
		t.Run(v.name, func(t *testing.T) {
			t.Logf("weight kernels: %s", v.w.Name())
			for _, path := range files {
				name := strings.TrimSuffix(filepath.Base(path), ".gguf")
				t.Run(name, func(t *testing.T) {
					want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
					cpuRoutes, cpuPre, cpuDec := cpuOracleRoutes(t, path, want)
					var gpuRoutes [][]tokenRoute
					var prefill []float32
					var decode [][]float32
					prefill, decode = runOracleWith(t, path, want, onGPU(dev, Options{DeviceOptions: v.opt}), func(c *Engine) {
						if len(cpuRoutes) > 0 {
							gpuRoutes = inspectRoutes(t, c, len(want.Prompt)+len(want.Generated), nil)
						}
					})
					got := flatLogits(prefill, decode)
					var ref []float32
					for _, r := range want.PrefillLogits {
						ref = append(ref, r...)
					}
					for _, r := range want.DecodeLogits {
						ref = append(ref, r...)
					}
					cpu := flatLogits(cpuPre, cpuDec)
					e, tol := nmse(got, ref), oracleTolerance(name)
					t.Logf("%s on GPU (%s): NMSE %.3g vs llama.cpp (bound %.0e), %.3g vs ats CPU", name, v.name, e, tol, nmse(got, cpu))
					if len(cpuRoutes) > 0 {
						e = judgeRoutes(t, name+" ("+v.name+")", cpuRoutes, gpuRoutes, got, ref, cpu, want.NVocab)
					}
					checkOracleNMSE(t, name, name+" on GPU ("+v.name+")", true, e, tol)
					nv := want.NVocab
					greedy := []int{ops.Argmax(prefill[len(prefill)-nv:])}
					for _, d := range decode[:len(decode)-1] {
						greedy = append(greedy, ops.Argmax(d))
					}
					if !slices.Equal(greedy, want.Generated) {
						if tol == 1e-4 {
							t.Errorf("greedy tokens %v, want %v", greedy, want.Generated)
						} else {
							t.Logf("greedy tokens differ from llama.cpp's (allowed for quantized weights)")
						}
					}
				})
			}
		})
	}
}

// inspectRoutes has every backend of the context that runs MoE ops (the
// GPU's and the host's: a hybrid placement routes some layers on each)
// report its routing, and returns where it goes: [MoE op][row], filled as
// the context runs rows tokens. Each record's ids are checked against
// cpu.Route on the backend's own router logits (the GPU's routing kernel
// against its CPU twin). With impose ([MoE op][row], the CPU's routing),
// the backends then use impose's experts instead of their own choice,
// weighted by their own probabilities (renormalised as the op says): only
// the discrete choice is the CPU's.
func inspectRoutes(t *testing.T, c *Engine, rows int, impose [][]tokenRoute) [][]tokenRoute {
	t.Helper()
	routes, f := routeInspector(t, c, rows, impose)
	if g, ok := c.Ctx.Device().(*cuda.Exec); ok {
		g.InspectRoutes(f)
	}
	c.Ctx.Host().InspectRoutes(f)
	return routes
}

// routeInspector is the inspector inspectRoutes sets:
// it fills the routes it returns ([MoE op][row]) and imposes impose's
// choice when impose is set.
func routeInspector(t *testing.T, c *Engine, rows int, impose [][]tokenRoute) ([][]tokenRoute, backend.RouteInspector) {
	t.Helper()
	p := c.Model.Prog
	moe := moeOps(p)
	index := map[int]int{}
	routes := make([][]tokenRoute, len(moe))
	for j, i := range moe {
		index[i] = j
		routes[j] = make([]tokenRoute, rows)
	}
	return routes, func(r *backend.RouteRecord) bool {
		j, ok := index[r.Op]
		if !ok {
			t.Errorf("routing of op %d, which is no MoE op", r.Op)
			return false
		}
		op := &p.Ops[r.Op]
		for k := 0; k < r.NTok; k++ {
			row := r.Pos0 + k
			if row >= rows {
				t.Errorf("MoE op %d routed position %d, past the %d tokens of the oracle", r.Op, row, rows)
				return false
			}
			rt := routeOf(r.Logits[k*r.NExpert:(k+1)*r.NExpert], r.TopK, op.NormTopK)
			ids := make([]int, r.TopK)
			for s, id := range r.IDs[k*r.TopK : (k+1)*r.TopK] {
				ids[s] = int(id)
			}
			if !slices.Equal(ids, rt.ids) {
				t.Errorf("MoE op %d, token %d: the routing chose %v, cpu.Route on the same logits %v", r.Op, row, ids, rt.ids)
			}
			if impose != nil {
				ids, w := impose[j][row].ids, r.Weights[k*r.TopK:(k+1)*r.TopK]
				var sum float32
				for s, e := range ids {
					r.IDs[k*r.TopK+s] = int32(e)
					w[s] = rt.probs[e]
					sum += w[s]
				}
				if op.NormTopK {
					for s := range w {
						w[s] /= sum
					}
				}
			}
			rt.ids = ids
			routes[j][row] = rt
		}
		return impose != nil
	}
}

// TestOraclesGPUWithCPURouting runs the MoE oracles on the GPU with the
// CPU backend's expert choice imposed on every token and layer (each
// expert weighted by the GPU's own router probabilities), and judges all
// rows with the oracle bound: what is left is the GPU's arithmetic, as
// for the dense models. It also counts the flips of the GPU's own choice
// under that imposed history.
func TestOraclesGPUWithCPURouting(t *testing.T) {
	dev := needGPUDevice(t)
	files := oracleFiles(t)
	for _, v := range gpuWeightVariants(dev) {
		t.Run(v.name, func(t *testing.T) {
			for _, path := range files {
				name := strings.TrimSuffix(filepath.Base(path), ".gguf")
				want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
				cpuRoutes, cpuPre, cpuDec := cpuOracleRoutes(t, path, want)
				if len(cpuRoutes) == 0 {
					continue
				}
				t.Run(name, func(t *testing.T) {
					var own [][]tokenRoute
					var prefill []float32
					var decode [][]float32
					prefill, decode = runOracleWith(t, path, want, onGPU(dev, Options{DeviceOptions: v.opt}), func(c *Engine) {
						own = inspectRoutes(t, c, len(want.Prompt)+len(want.Generated), cpuRoutes)
					})
					got, cpu := flatLogits(prefill, decode), flatLogits(cpuPre, cpuDec)
					ref := flatLogits(nil, append(slices.Clone(want.PrefillLogits), want.DecodeLogits...))
					flips, _ := routeFlips(cpuRoutes, own)
					e, tol := nmse(got, ref), oracleTolerance(name)
					t.Logf("IMPOSED %s (%s): with the CPU's expert choice, NMSE %.3g vs llama.cpp (bound %.0e), %.3g vs ats CPU; the GPU's own choice would differ at %d token x layer pairs", name, v.name, e, tol, nmse(got, cpu), len(flips))
					checkOracleNMSE(t, name, name+" on GPU ("+v.name+") with the CPU's routing", true, e, tol)
				})
			}
		})
	}
}

// judgeRoutes reports the routing flips between the CPU's routes and the
// GPU's (with the margins at each flip: the gap between the k-th and the
// (k+1)-th router probability, on either backend) and returns the NMSE
// against llama.cpp of the rows whose routing agrees in every layer. It
// fails the test when fewer than half the tokens agree: isolated near-ties
// do not flip most of a prompt.
func judgeRoutes(t *testing.T, what string, cpuRoutes, gpuRoutes [][]tokenRoute, got, ref, cpu []float32, nv int) float64 {
	t.Helper()
	for j := range gpuRoutes {
		for r := range gpuRoutes[j] {
			if gpuRoutes[j][r].ids == nil {
				t.Fatalf("MoE op %d, token %d: no routing came back from the GPU", j, r)
			}
		}
	}
	flips, agree := routeFlips(cpuRoutes, gpuRoutes)
	var keep []int
	for r, ok := range agree {
		if ok {
			keep = append(keep, r)
		}
	}
	rowsOf := func(x []float32) []float32 { return pickRows(x, keep, nv) }
	for _, f := range flips {
		t.Logf("routing flip: %s", f)
	}
	rows, pairs := len(agree), len(agree)*len(cpuRoutes)
	e := nmse(rowsOf(got), rowsOf(ref))
	t.Logf("ROUTES %s: %d of %d tokens routed differently from the CPU (%d of %d token x layer pairs), largest margin at a flip: CPU %.3g, GPU %.3g", what, rows-len(keep), rows, len(flips), pairs, maxMargin(flips, true), maxMargin(flips, false))
	t.Logf("ROUTES %s: NMSE vs llama.cpp %.3g on the %d rows whose routing agrees, %.3g on all %d rows; vs ats CPU %.3g and %.3g", what, e, len(keep), nmse(got, ref), rows, nmse(rowsOf(got), rowsOf(cpu)), nmse(got, cpu))
	type rowErr struct {
		row   int
		e     float64
		agree bool
	}
	var worst []rowErr
	for r := range agree {
		worst = append(worst, rowErr{r, nmse(got[r*nv:(r+1)*nv], ref[r*nv:(r+1)*nv]), agree[r]})
	}
	slices.SortFunc(worst, func(a, b rowErr) int { return cmp.Compare(b.e, a.e) })
	var line []string
	for _, w := range worst[:min(6, len(worst))] {
		tag := "agrees"
		if !w.agree {
			tag = "flipped"
		}
		line = append(line, fmt.Sprintf("token %d (%s) %.3g", w.row, tag, w.e))
	}
	t.Logf("ROUTES %s: worst rows' NMSE vs llama.cpp: %s", what, strings.Join(line, ", "))
	if 2*len(keep) < rows {
		t.Errorf("%d of %d tokens routed differently from the CPU: more than near-ties", rows-len(keep), rows)
	}
	return e
}

// pickRows joins the given rows of nv values of x.
func pickRows(x []float32, rows []int, nv int) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, x[r*nv:(r+1)*nv]...)
	}
	return out
}

// maxMargin is the largest margin, on the CPU (a) or the GPU side, among
// the flips (0 without flips).
func maxMargin(flips []routeFlip, cpuSide bool) float64 {
	m := 0.0
	for _, f := range flips {
		if cpuSide {
			m = max(m, f.marginA)
		} else {
			m = max(m, f.marginB)
		}
	}
	return m
}

// TestGPUGraphMatchesEager checks that the captured decode step gives the
// logits of launching its kernels one by one, bit for bit, over several
// positions (the graph reads the position from device memory), that
// programmatic dependent launch changes no bit either, and that a prompt
// in batches of 5 matches one batch.
func TestGPUGraphMatchesEager(t *testing.T) {
	dev := needGPUDevice(t)
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	for _, name := range []string{"tiny-qwen3moe-q4_k_m", "tiny-glm4-q4_k_m", "tiny-llama-q4_0", "tiny-qwen3-f16"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".gguf")
			if _, err := os.Stat(path); err != nil {
				t.Fatal(err)
			}
			want := loadOracle(t, filepath.Join(dir, name+".logits.json"))
			want.Generated = want.Generated[:6]
			pre, dec := runOracle(t, path, want, onGPU(dev, Options{}))
			// Programmatic dependent launch (on by default where the device
			// has it) changes when kernels start, never what they compute.
			preS, decS := runOracle(t, path, want, onGPU(dev, Options{DeviceOptions: backend.Options{NoPDL: true}}))
			if !slices.Equal(pre, preS) {
				t.Fatalf("prefill logits differ with programmatic dependent launch off (NMSE %.3g)", nmse(pre, preS))
			}
			for s := range dec {
				if !slices.Equal(dec[s], decS[s]) {
					t.Fatalf("decode step %d: logits differ with programmatic dependent launch off (NMSE %.3g)", s, nmse(dec[s], decS[s]))
				}
			}
			eager := onGPU(dev, Options{DeviceOptions: backend.Options{NoGraphs: true}})
			// The eager runs also read the MoE routing back (inspection must
			// not change the logits: the comparisons below check it too).
			rows := len(want.Prompt) + len(want.Generated)
			var one, five [][]tokenRoute
			pre2, dec2 := runOracleWith(t, path, want, eager, func(c *Engine) { one = inspectRoutes(t, c, rows, nil) })
			if !slices.Equal(pre, pre2) {
				t.Fatal("prefill logits differ between runs")
			}
			for s := range dec {
				if !slices.Equal(dec[s], dec2[s]) {
					t.Fatalf("decode step %d: the graph's logits differ from eager launches (NMSE %.3g)", s, nmse(dec[s], dec2[s]))
				}
			}
			// Batches of 5 take the weight kernels' matrix-vector path (Q8_1
			// activations), one batch of the whole prompt the tensor-core
			// path (f16 activations): the same function to within the
			// quantization of the activations, except where an MoE router
			// is nearly tied and the two send a token to different experts.
			// The rows of tokens routed alike in every layer are judged.
			five5 := eager
			five5.Batch = 5
			pre3, _ := runOracleWith(t, path, want, five5, func(c *Engine) { five = inspectRoutes(t, c, rows, nil) })
			e := nmse(pre3, pre)
			t.Logf("prompt of %d in batches of 5 against one batch: NMSE %.3g", len(want.Prompt), e)
			if len(one) > 0 {
				flips, agree := routeFlips(one, five)
				for _, f := range flips {
					t.Logf("routing flip, one batch vs batches of 5: %s", f)
				}
				var keep []int
				for r := range want.Prompt {
					if agree[r] {
						keep = append(keep, r)
					}
				}
				nv := want.NVocab
				e = nmse(pickRows(pre3, keep, nv), pickRows(pre, keep, nv))
				t.Logf("%d of %d prompt tokens routed differently; NMSE %.3g on the %d rows routed alike", len(want.Prompt)-len(keep), len(want.Prompt), e, len(keep))
				if 2*len(keep) < len(want.Prompt) {
					t.Fatalf("%d of %d prompt tokens routed differently in batches of 5: more than near-ties", len(want.Prompt)-len(keep), len(want.Prompt))
				}
			}
			if e > 1e-3 {
				t.Fatalf("prompt in batches of 5 against one batch: NMSE %.3g", e)
			}
		})
	}
}

// TestGPUTruncate checks that a GPU context continues correctly after
// Truncate: the cache rows past the cut are overwritten.
func TestGPUTruncate(t *testing.T) {
	dev := needGPUDevice(t)
	var path string
	for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3-bf16"} {
		p := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", name+".gguf")
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("no tiny-qwen3 oracle model")
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// eval runs the batches in a new context, truncating it to keep
	// positions before the batch where keep says so (-1: not).
	eval := func(keep []int, batches ...[]int) []float32 {
		c, err := newCtx(m, onGPU(dev, Options{CtxSize: 64}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.Backend() != executor.BackendGPU {
			t.Fatalf("backend %s", c.Backend())
		}
		var l []float32
		for i, b := range batches {
			if keep[i] >= 0 {
				if err := c.Truncate(keep[i]); err != nil {
					t.Fatal(err)
				}
			}
			if l, err = c.Eval(b, false); err != nil {
				t.Fatal(err)
			}
		}
		return l
	}
	prompt := []int{1, 2, 3, 4, 5, 6}
	truncated := eval([]int{-1, -1, 5}, prompt, []int{9, 9, 9}, []int{6})
	fresh := eval([]int{-1, -1}, prompt[:5], []int{6})
	// The same kernels over the same cells: the stale cells past the kept
	// positions must not be read.
	if e := nmse(truncated, fresh); e > 1e-6 {
		t.Fatalf("after truncating and re-feeding the same token: NMSE %.3g against a fresh context", e)
	}
	// Against the prompt's last row (one pass): the prefill kernels, the
	// same function (decode's attention kernel rounds otherwise).
	if e := nmse(truncated, eval([]int{-1}, prompt)); e > 1e-3 {
		t.Fatalf("after truncating and re-feeding the same token: NMSE %.3g against the prompt's last row", e)
	}
}
