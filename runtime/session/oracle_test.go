package session

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/placement"
	"github.com/google/go-cmp/cmp"
)

// oracleLogits is the layout of testdata/oracle/*.logits.json.
type oracleLogits struct {
	Prompt        []int       `json:"prompt"`
	NVocab        int         `json:"n_vocab"`
	PrefillLogits [][]float32 `json:"prefill_logits"`
	Generated     []int       `json:"generated"`
	DecodeLogits  [][]float32 `json:"decode_logits"`
}

// nmse is sum((a-b)²) / sum(b²), the oracle README's measure.
func nmse(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return num / den
}

// oracleTolerance is the README's bound: 1e-4 for float weights, 1e-3 for
// quantized ones.
func oracleTolerance(name string) float64 {
	for _, f := range []string{"-f32", "-f16", "-bf16"} {
		if strings.HasSuffix(name, f) {
			return 1e-4
		}
	}
	return 1e-3
}

// oracleMargin is the share of the README's bound the tests hold every
// oracle to: a result that passes the bound by a little is luck, and one
// more rounding step in a kernel would tip it over unseen. The README's
// bound stays the contract; this is the tests' margin below it.
const oracleMargin = 0.6

// checkNMSE fails t when e is above oracleMargin of the bound tol.
func checkNMSE(t *testing.T, what string, e, tol float64) {
	t.Helper()
	if e > oracleMargin*tol {
		t.Errorf("%s: NMSE %.3g over %.1f of the bound %.0e (%.2g)", what, e, oracleMargin, tol, oracleMargin*tol)
	}
}

// gpuOverMargin lists the oracle models known to land between
// oracleMargin and the bound when the GPU computes part of them, and why.
// They fail over the bound only, and say so in the log; every other model
// is held to the margin. None is now: tiny-glm4-q4_k_m (5.9-7.0e-4 with
// decode activations in one int8 plane) lands at 5.4-5.97e-4 with two.
var gpuOverMargin = map[string]string{}

// checkOracleNMSE is checkNMSE, except that a model in gpuOverMargin,
// in a run the GPU took part in (gpu), fails over the bound only.
func checkOracleNMSE(t *testing.T, name, what string, gpu bool, e, tol float64) {
	t.Helper()
	if why, ok := gpuOverMargin[name]; ok && gpu {
		if e > oracleMargin*tol {
			t.Logf("%s: NMSE %.3g over %.1f of the bound %.0e: known (%s)", what, e, oracleMargin, tol, why)
		}
		if e > tol {
			t.Errorf("%s: NMSE %.3g over the bound %.0e", what, e, tol)
		}
		return
	}
	checkNMSE(t, what, e, tol)
}

// runOracle evaluates one oracle model the way `ats eval` does and returns
// our logits for the prompt and for each decode step.
func runOracle(t *testing.T, path string, want *oracleLogits, opt Options) (prefill []float32, decode [][]float32) {
	t.Helper()
	return runOracleWith(t, path, want, opt, nil)
}

// runOracleWith is runOracle with setup called on the engine before the
// prompt (nil: none).
func runOracleWith(t *testing.T, path string, want *oracleLogits, opt Options, setup func(*Engine)) (prefill []float32, decode [][]float32) {
	t.Helper()
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return evalOracle(t, m, want, opt, setup, nil)
}

// evalOracle runs the oracle's prompt and decode steps on a new engine of
// m, one sequence: setup is called before the prompt, afterStep after each
// decode step (nil: none).
func evalOracle(t *testing.T, m *model.Model, want *oracleLogits, opt Options, setup, afterStep func(*Engine)) (prefill []float32, decode [][]float32) {
	t.Helper()
	c, err := NewEngine(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seq := c.Ctx.KV().NewSeq()
	defer seq.Close()
	if setup != nil {
		setup(c)
	}
	prefill, err = c.Eval(seq, want.Prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	prefill = slices.Clone(prefill)
	for _, tok := range want.Generated {
		l, err := c.Eval(seq, []int{tok}, false)
		if err != nil {
			t.Fatal(err)
		}
		decode = append(decode, slices.Clone(l))
		if afterStep != nil {
			afterStep(c)
		}
	}
	return prefill, decode
}

func loadOracle(t *testing.T, path string) *oracleLogits {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var o oracleLogits
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &o
}

// TestOracles checks every oracle model against llama.cpp's logits for the
// prompt and every decode step, and greedy tokens for float models.
func TestOracles(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no oracle models in %s", dir)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
			prefill, decode := runOracle(t, path, want, Options{Threads: 2})
			var got, ref []float32
			got = append(got, prefill...)
			for _, r := range want.PrefillLogits {
				ref = append(ref, r...)
			}
			for s, r := range want.DecodeLogits {
				got = append(got, decode[s]...)
				ref = append(ref, r...)
			}
			e := nmse(got, ref)
			tol := oracleTolerance(name)
			t.Logf("%s: NMSE %.3g (bound %.0e)", name, e, tol)
			checkNMSE(t, name, e, tol)
			// Greedy tokens: argmax after the prompt and after each step.
			nv := want.NVocab
			greedy := []int{ops.Argmax(prefill[len(prefill)-nv:])}
			for _, d := range decode[:len(decode)-1] {
				greedy = append(greedy, ops.Argmax(d))
			}
			mismatch := 0
			for i := range greedy {
				if greedy[i] != want.Generated[i] {
					mismatch++
				}
			}
			if mismatch > 0 {
				if tol == 1e-4 {
					t.Errorf("greedy tokens %v, want %v", greedy, want.Generated)
				} else {
					t.Logf("greedy tokens differ at %d of %d steps (allowed for quantized weights)", mismatch, len(greedy))
				}
			}
		})
	}
}

// TestThreadsIdentical checks that the logits do not depend on the thread
// count: each output value is computed by one worker in a fixed order.
func TestThreadsIdentical(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	for _, name := range []string{"tiny-qwen3moe-q4_k_m", "tiny-glm4-q4_k_m", "tiny-llama-q4_0", "tiny-qwen3-f16"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".gguf")
			want := loadOracle(t, filepath.Join(dir, name+".logits.json"))
			want.Generated = want.Generated[:4]
			ref, refDec := runOracle(t, path, want, Options{Threads: 1})
			for _, threads := range []int{2, 8} {
				got, dec := runOracle(t, path, want, Options{Threads: threads})
				if diff := cmp.Diff(ref, got); diff != "" {
					t.Fatalf("%d threads: prefill logits differ from 1 thread", threads)
				}
				if diff := cmp.Diff(refDec, dec); diff != "" {
					t.Fatalf("%d threads: decode logits differ from 1 thread", threads)
				}
			}
		})
	}
}

// TestSmallBatches checks that a prompt split into several batches gives
// the same logits as one batch (the cache carries the sequence across).
func TestSmallBatches(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	path := filepath.Join(dir, "tiny-qwen3-q4_k_m.gguf")
	want := loadOracle(t, filepath.Join(dir, "tiny-qwen3-q4_k_m.logits.json"))
	want.Generated = want.Generated[:2]
	ref, _ := runOracle(t, path, want, Options{Threads: 2})
	got, _ := runOracle(t, path, want, Options{Threads: 2, Batch: 5})
	if e := nmse(got, ref); e > 1e-12 {
		t.Fatalf("batch 5 against one batch: NMSE %g", e)
	}
}

// MoE routing of the oracle prompts. A token's expert choice is discrete:
// where two router probabilities are nearly tied, the last bits of the
// router's input decide it, and one backend may send the token to another
// expert than the other. The GPU oracle test counts such flips against the
// CPU backend (gpu_test.go); the driver below gives the CPU's routing.

// tokenRoute is one MoE op's routing of one token.
type tokenRoute struct {
	probs []float32 // the softmax of the router's logits
	ids   []int     // the chosen experts, in slot order
}

// margin is the gap between the k-th and the (k+1)-th largest router
// probability: how far the choice is from a tie (k = all experts: 1).
func (r tokenRoute) margin() float64 {
	k := len(r.ids)
	if k >= len(r.probs) {
		return 1
	}
	p := slices.Clone(r.probs)
	sort.Slice(p, func(a, b int) bool { return p[a] > p[b] })
	return float64(p[k-1] - p[k])
}

// sameExperts says whether two routings chose the same set of experts
// (their slot order may differ).
func sameExperts(a, b []int) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// routeOf routes one token's router logits as the CPU backend does
// (cpu.Route).
func routeOf(logits []float32, k int, norm bool) tokenRoute {
	r := tokenRoute{probs: slices.Clone(logits), ids: make([]int, k)}
	cpu.Route(r.probs, k, norm, r.ids, make([]float32, k), make([]int, len(logits)))
	return r
}

// moeOps lists the program's MoE ops.
func moeOps(p *ir.Program) []int {
	var ids []int
	for i := range p.Ops {
		if p.Ops[i].Class().Experts {
			ids = append(ids, i)
		}
	}
	return ids
}

// cpuOracleRoutes evaluates an oracle on a CPU backend of its own, op
// range by op range, and before each MoE op recomputes the op's routing
// from its input with the op's own arithmetic (the router product and
// cpu.Route): routes[j][row] is MoE op j's routing of token row (prompt
// then generated tokens, the rows of the logits). The logits are those
// of a CPU context (TestCPUOracleRoutes checks it).
func cpuOracleRoutes(t *testing.T, path string, want *oracleLogits) (routes [][]tokenRoute, prefill []float32, decode [][]float32) {
	t.Helper()
	return cpuOracleRoutesKV(t, path, want, kvcache.F16)
}

// cpuOracleRoutesKV is cpuOracleRoutes with a KV cache of type kt.
func cpuOracleRoutesKV(t *testing.T, path string, want *oracleLogits, kt kvcache.Type) (routes [][]tokenRoute, prefill []float32, decode [][]float32) {
	t.Helper()
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	w, err := cpu.NewWeights(m.Prog)
	if err != nil {
		t.Fatal(err)
	}
	placement.RepackHost(w) // as a CPU-only engine does
	p := m.Prog
	pool := ops.NewPool(2)
	defer pool.Close()
	n := len(want.Prompt)
	kv, err := kvcache.New(n+len(want.Generated), 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cpu.New(w, pool, cpu.Options{Batch: n, KV: model.KV{Rows: kv.Rows(), Type: kt}, LogitRows: n})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	seq := kv.NewSeq()
	moe := moeOps(p)
	routes = make([][]tokenRoute, len(moe))
	nv := p.Hyper.NVocab
	eval := func(tokens []int, all bool) []float32 {
		if err := seq.Reserve(len(tokens)); err != nil {
			t.Fatal(err)
		}
		want := 1
		if all {
			want = len(tokens)
		}
		bt := SingleBatch(seq, tokens, want)
		b.Begin()
		rows, lo := len(tokens), 0
		for j, i := range moe {
			if rows, err = b.Run(lo, i, bt, rows); err != nil {
				t.Fatal(err)
			}
			op := &p.Ops[i]
			r := w.Of(op.W)
			ne, emb := r.Rows, r.Cols
			logits := make([]float32, rows*ne)
			r.Mul(pool, b.Buf(op.In)[:rows*emb], rows, logits, ne, make([]byte, r.ActBytes(rows)))
			for k := 0; k < rows; k++ {
				routes[j] = append(routes[j], routeOf(logits[k*ne:(k+1)*ne], op.TopK, op.NormTopK))
			}
			lo = i
		}
		if rows, err = b.Run(lo, len(p.Ops), bt, rows); err != nil {
			t.Fatal(err)
		}
		if err := seq.Append(bt.Tokens); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(b.Buf(p.Logits)[:rows*nv])
	}
	prefill = eval(want.Prompt, true)
	for _, tok := range want.Generated {
		decode = append(decode, eval([]int{tok}, false))
	}
	return routes, prefill, decode
}

// routeFlip is a token and MoE op whose chosen experts differ between two
// routings.
type routeFlip struct {
	op, row          int
	a, b             tokenRoute
	marginA, marginB float64
}

func (f routeFlip) String() string {
	return fmt.Sprintf("MoE op %d, token %d: experts %v vs %v; margins (p_k - p_k+1) %.3g vs %.3g", f.op, f.row, f.a.ids, f.b.ids, f.marginA, f.marginB)
}

// routeFlips compares two routings ([op][row]) and returns the flips and
// the rows whose routing agrees in every op.
func routeFlips(a, b [][]tokenRoute) (flips []routeFlip, agree []bool) {
	agree = make([]bool, len(a[0]))
	for r := range agree {
		agree[r] = true
	}
	for j := range a {
		for r := range a[j] {
			if !sameExperts(a[j][r].ids, b[j][r].ids) {
				flips = append(flips, routeFlip{op: j, row: r, a: a[j][r], b: b[j][r], marginA: a[j][r].margin(), marginB: b[j][r].margin()})
				agree[r] = false
			}
		}
	}
	return flips, agree
}

// TestCPUOracleRoutes checks that cpuOracleRoutes computes what a CPU
// context computes (bit for bit) and reports, per MoE oracle, the
// smallest router margins: how close the prompts come to a tie.
func TestCPUOracleRoutes(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "*moe*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no MoE oracle models in %s", dir)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
			routes, pre, dec := cpuOracleRoutes(t, path, want)
			refPre, refDec := runOracle(t, path, want, Options{Threads: 2})
			if diff := cmp.Diff(refPre, pre); diff != "" {
				t.Fatalf("prefill logits differ from a CPU context's")
			}
			if diff := cmp.Diff(refDec, dec); diff != "" {
				t.Fatalf("decode logits differ from a CPU context's")
			}
			var margins []float64
			for j := range routes {
				if len(routes[j]) != len(want.Prompt)+len(want.Generated) {
					t.Fatalf("MoE op %d: %d routed tokens, want %d", j, len(routes[j]), len(want.Prompt)+len(want.Generated))
				}
				for _, r := range routes[j] {
					margins = append(margins, r.margin())
				}
			}
			slices.Sort(margins)
			t.Logf("%s: %d routings (tokens x MoE layers); smallest margins p_k - p_k+1: %.3g", name, len(margins), margins[:min(5, len(margins))])
		})
	}
}

// TestCPURouteInspector checks the host backend's route inspection, which
// the hybrid oracle tests impose the CPU's expert choice through: what it
// reports is cpuOracleRoutes' routing; imposing that same choice leaves
// every logit as it was; imposing another changes them.
func TestCPURouteInspector(t *testing.T) {
	path := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3moe-q4_k_m.gguf")
	want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
	routes, refPre, refDec := cpuOracleRoutes(t, path, want)
	rows := len(want.Prompt) + len(want.Generated)
	var seen [][]tokenRoute
	pre, dec := runOracleWith(t, path, want, Options{Threads: 2}, func(c *Engine) { seen = inspectRoutes(t, c, rows, nil) })
	for j := range routes {
		for r := range routes[j] {
			if !slices.Equal(seen[j][r].ids, routes[j][r].ids) {
				t.Fatalf("MoE op %d, token %d: inspected experts %v, cpuOracleRoutes %v", j, r, seen[j][r].ids, routes[j][r].ids)
			}
		}
	}
	if !slices.Equal(pre, refPre) || cmp.Diff(dec, refDec) != "" {
		t.Fatal("inspecting the routing changed the logits")
	}
	pre, dec = runOracleWith(t, path, want, Options{Threads: 2}, func(c *Engine) { inspectRoutes(t, c, rows, routes) })
	if !slices.Equal(pre, refPre) || cmp.Diff(dec, refDec) != "" {
		t.Fatal("imposing the CPU's own routing changed the logits")
	}
	// Token 3 goes to its experts of the first MoE layer shifted by one.
	other := make([][]tokenRoute, len(routes))
	for j := range routes {
		other[j] = slices.Clone(routes[j])
	}
	ne := len(routes[0][3].probs)
	shifted := make([]int, len(routes[0][3].ids))
	for s, e := range routes[0][3].ids {
		shifted[s] = (e + 1) % ne
	}
	other[0][3].ids = shifted
	pre, _ = runOracleWith(t, path, want, Options{Threads: 2}, func(c *Engine) { inspectRoutes(t, c, rows, other) })
	nv := want.NVocab
	if !slices.Equal(pre[:3*nv], refPre[:3*nv]) {
		t.Error("imposing other experts on token 3 changed the tokens before it")
	}
	if slices.Equal(pre[3*nv:4*nv], refPre[3*nv:4*nv]) {
		t.Error("imposing other experts on token 3 left its logits as they were")
	}
}
