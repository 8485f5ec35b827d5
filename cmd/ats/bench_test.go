package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/tools/synth"
)

// tinyModel writes a small synthetic model for the bench tests.
func tinyModel(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, err := synth.Write(path, synth.Options{Preset: "tiny-qwen3", Layout: "q4_k_m", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBenchJSON(t *testing.T) {
	m := tinyModel(t)
	out, _, err := runATS(t, "bench", "-m", m, "-p", "16", "-n", "4", "-r", "3", "-t", "1,2", "-o", "json", "--backend", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var rs []map[string]any
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results, want 4 (pp and tg at 1 and 2 threads)", len(rs))
	}
	for _, r := range rs {
		for _, k := range []string{"test", "n_prompt", "n_gen", "avg_ts", "stddev_ts", "n_threads", "samples_ts", "model_size", "model_n_params"} {
			if _, ok := r[k]; !ok {
				t.Errorf("result lacks %q: %v", k, r)
			}
		}
		switch r["test"] {
		case "pp16":
			if r["n_prompt"] != 16.0 || r["n_gen"] != 0.0 {
				t.Errorf("pp16: n_prompt %v n_gen %v", r["n_prompt"], r["n_gen"])
			}
		case "tg4":
			if r["n_prompt"] != 0.0 || r["n_gen"] != 4.0 {
				t.Errorf("tg4: n_prompt %v n_gen %v", r["n_prompt"], r["n_gen"])
			}
		default:
			t.Errorf("unexpected test %v", r["test"])
		}
		if ts, _ := r["avg_ts"].(float64); !(ts > 0) {
			t.Errorf("%v: avg_ts %v", r["test"], r["avg_ts"])
		}
		if s, _ := r["samples_ts"].([]any); len(s) != 3 {
			t.Errorf("%v: %d samples, want 3", r["test"], len(s))
		}
	}
}

func TestBenchMarkdownAndCSV(t *testing.T) {
	m := tinyModel(t)
	out, _, err := runATS(t, "bench", "-m", m, "-p", "8", "-n", "2", "-r", "2", "-t", "1", "--backend", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| model |", "| pp8 |", "| tg2 |", " ± "} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runATS(t, "bench", "-m", m, "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o", "csv", "--backend", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0][12] != "n_depth" || rows[0][13] != "test" || rows[1][13] != "pp8" {
		t.Errorf("csv: %q", rows)
	}
}

func TestBenchErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "-m MODEL"},
		{[]string{"bench", "-m", "x.gguf", "-o", "xml"}, "want md, json or csv"},
		{[]string{"bench", "-m", "x.gguf", "-r", "0"}, "repetition"},
		{[]string{"bench", "-m", "x.gguf", "-p", "abc"}, "-p"},
		{[]string{"bench", "-m", "x.gguf", "-t", "0"}, "-t"},
		{[]string{"bench", "-m", "x.gguf", "-c", "-1"}, "ctx-size"},
		{[]string{"bench", "-m", filepath.Join(t.TempDir(), "missing.gguf"), "--backend", "cpu"}, "missing.gguf"},
	} {
		_, _, err := runATS(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}

// The bench warns when a long prompt's routing used under half of the
// CPU's experts of the split layers (a random model's routing), and only
// then.
func TestRoutingNote(t *testing.T) {
	for _, c := range []struct {
		prompt          int
		experts, routed float64
		want            bool
	}{
		{512, 32, 9.7, true},
		{512, 32, 32, false},
		{512, 32, 16, false},
		{64, 32, 4, false}, // a short prompt reaches few experts anyway
		{512, 0, 0, false}, // nothing split
	} {
		r := benchResult{NPrompt: c.prompt, SplitExperts: c.experts, SplitRouted: c.routed}
		if got := routingNote(&r); (got != "") != c.want || c.want && !strings.Contains(got, "--routing balanced") {
			t.Errorf("%+v: %q", c, got)
		}
	}
}

// TestPrefillFloor checks the floor of a streamed prompt against sums
// done by hand: the bytes over the two rates together.
func TestPrefillFloor(t *testing.T) {
	for _, c := range []struct {
		name            string
		streamed, share int64
		link            float64
		shareTime       time.Duration
		want            time.Duration
	}{
		// 9.6 GB over 50 GB/s and 2.4 GB read in 120 ms (20 GB/s): 12 GB at 70 GB/s.
		{"split", 9_600_000_000, 2_400_000_000, 50e9, 120 * time.Millisecond, 171428571 * time.Nanosecond},
		// No split: the link alone.
		{"stream only", 5_000_000_000, 0, 50e9, 0, 100 * time.Millisecond},
		{"no link rate", 5_000_000_000, 0, 0, 0, 0},
		{"nothing moved", 0, 0, 50e9, 0, 0},
		// A share whose time was not measured adds its bytes, not its rate.
		{"share untimed", 4_000_000_000, 1_000_000_000, 50e9, 0, 100 * time.Millisecond},
	} {
		got := prefillFloor(c.streamed, c.share, c.link, c.shareTime)
		if d := got - c.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// -d runs each test after that many tokens of context, as llama-bench's
// --n-depth: the tests are named pp16 @ d64 and carry n_depth, and the
// cache's types as llama-bench's type_k and type_v.
func TestBenchDepth(t *testing.T) {
	m := tinyModel(t)
	out, _, err := runATS(t, "bench", "-m", m, "-p", "16", "-n", "4", "-d", "0,64", "-r", "1", "-t", "2", "-o", "json", "--backend", "cpu", "-ctk", "q4_0", "-ctv", "q4_0")
	if err != nil {
		t.Fatal(err)
	}
	var rs []struct {
		Test   string  `json:"test"`
		NDepth int     `json:"n_depth"`
		AvgTs  float64 `json:"avg_ts"`
		TypeK  string  `json:"type_k"`
		TypeV  string  `json:"type_v"`
	}
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	var got []string
	for _, r := range rs {
		got = append(got, fmt.Sprintf("%s/%d", r.Test, r.NDepth))
		if !(r.AvgTs > 0) {
			t.Errorf("%s: avg_ts %v", r.Test, r.AvgTs)
		}
		if r.TypeK != "q4_0" || r.TypeV != "q4_0" {
			t.Errorf("%s: type_k %q, type_v %q, want q4_0", r.Test, r.TypeK, r.TypeV)
		}
	}
	if want := []string{"pp16/0", "tg4/0", "pp16 @ d64/64", "tg4 @ d64/64"}; !slices.Equal(got, want) {
		t.Errorf("tests %v, want %v", got, want)
	}
	if _, _, err := runATS(t, "bench", "-m", m, "-d", "-1"); err == nil || !strings.Contains(err.Error(), "-d") {
		t.Errorf("-d -1: %v", err)
	}
}

// bench --parallel N decodes N sequences together: the tg tests carry
// n_parallel and count every sequence's tokens, each sequence gets its own
// depth, and pp tests are unchanged.
func TestBenchParallel(t *testing.T) {
	m := tinyModel(t)
	out, _, err := runATS(t, "bench", "-m", m, "-p", "8", "-n", "4", "-d", "0,300", "--parallel", "1,3", "-r", "1", "-t", "2", "-o", "json", "--backend", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	var rs []struct {
		Test      string  `json:"test"`
		NParallel int     `json:"n_parallel"`
		NGen      int     `json:"n_gen"`
		AvgNs     int64   `json:"avg_ns"`
		AvgTs     float64 `json:"avg_ts"`
	}
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out)
	}
	var got []string
	for _, r := range rs {
		got = append(got, fmt.Sprintf("%s/%d", r.Test, r.NParallel))
		tokens := r.NGen * max(r.NParallel, 1)
		if r.NGen == 0 {
			tokens = 8
		}
		if want := float64(tokens) / (float64(r.AvgNs) / 1e9); math.Abs(r.AvgTs-want) > 1e-6*want {
			t.Errorf("%s: avg_ts %v, want %d tokens over avg_ns %d: %v", r.Test, r.AvgTs, tokens, r.AvgNs, want)
		}
	}
	want := []string{"pp8/0", "tg4/0", "tg4 x3/3", "pp8 @ d300/0", "tg4 @ d300/0", "tg4 x3 @ d300/3"}
	if !slices.Equal(got, want) {
		t.Errorf("tests %v, want %v", got, want)
	}
	for _, args := range [][]string{
		{"bench", "-m", m, "--parallel", "0"},
		{"bench", "--serve", "http://127.0.0.1:1", "--parallel", "4"},
		{"bench", "-m", m, "--stress", "cpu=50", "--parallel", "4"},
	} {
		if _, _, err := runATS(t, args...); err == nil || !strings.Contains(err.Error(), "--parallel") {
			t.Errorf("%v: %v, want an error naming --parallel", args[1:], err)
		}
	}
}

// bench --serve loads a running server: every request streams its tokens,
// the rows carry rates and latencies, and a late request is timed.
func TestBenchServe(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	url, _, _ := startServe(t, "-m", m, "--parallel", "2", "-c", "1024")
	out, stderr, err := runATS(t, "bench", "--serve", url, "--concurrency", "1,2", "-n", "6", "--late", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var rs []serveBenchResult
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rs) != 2 || rs[0].Concurrency != 1 || rs[1].Concurrency != 2 {
		t.Fatalf("rows %+v", rs)
	}
	for _, r := range rs {
		if r.Failed != 0 || len(r.Requests) != r.Concurrency || !(r.Aggregate > 0) || !(r.TTFTp50 > 0) || !(r.TPOTp50 > 0) {
			t.Errorf("row %+v", r)
		}
		for _, q := range r.Requests {
			if q.Tokens != 6 || q.PromptTokens == 0 {
				t.Errorf("request %+v: want 6 tokens (ignore_eos) and its prompt's count", q)
			}
		}
	}
	if !(rs[1].LateTTFT > 0) {
		t.Errorf("no late request timed at concurrency 2: %+v", rs[1])
	}
	md, _, err := runATS(t, "bench", "--serve", url, "--concurrency", "2", "-n", "4", "-p", "50")
	if err != nil || !strings.Contains(md, "| concurrency |") || !strings.Contains(md, "\n| 2 | ") {
		t.Errorf("markdown: %v\n%s", err, md)
	}
	// ats serve takes the sampled requests' temperature and seeds.
	if _, stderr, err := runATS(t, "bench", "--serve", url, "--concurrency", "2", "-n", "4", "--late", "--temperature", "0.8", "--seed", "10"); err != nil {
		t.Errorf("--temperature 0.8 --seed 10: %v\n%s", err, stderr)
	}
	if _, _, err := runATS(t, "bench", "--serve", "http://127.0.0.1:1", "-n", "4"); err == nil || !strings.Contains(err.Error(), "warm-up") {
		t.Errorf("no server: %v", err)
	}
}

// servedBody is what the sampling test reads of a request's body.
type servedBody struct {
	Temperature *float64 `json:"temperature"`
	Seed        *int64   `json:"seed"`
}

// fakeCompletions is an OpenAI-compatible /v1/completions that streams
// four tokens and records every request's body, the warm-up's first.
func fakeCompletions(t *testing.T) (url string, bodies func() []servedBody) {
	t.Helper()
	var mu sync.Mutex
	var got []servedBody
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		b, err := io.ReadAll(r.Body)
		var body servedBody
		if err == nil {
			err = json.Unmarshal(b, &body)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, body)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for range 4 {
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []servedBody {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// --temperature T > 0 sends T and seed S+i to request i (0 the warm-up),
// so that the requests of a synthetic model do not all decode the same
// tokens; without it the requests are greedy and carry no seed.
func TestBenchServeTemperature(t *testing.T) {
	f64 := func(v float64) *float64 { return &v }
	i64 := func(v int64) *int64 { return &v }
	bySeed := cmp.Transformer("bySeed", func(b []servedBody) []servedBody {
		b = slices.Clone(b)
		slices.SortFunc(b, func(x, y servedBody) int {
			if x.Seed == nil || y.Seed == nil {
				return 0
			}
			return int(*x.Seed - *y.Seed)
		})
		return b
	})

	url, bodies := fakeCompletions(t)
	out, stderr, err := runATS(t, "bench", "--serve", url, "--concurrency", "3", "-n", "4", "--temperature", "0.8", "--seed", "10", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want := []servedBody{{f64(0.8), i64(10)}, {f64(0.8), i64(11)}, {f64(0.8), i64(12)}, {f64(0.8), i64(13)}}
	if d := cmp.Diff(want, bodies(), bySeed); d != "" {
		t.Errorf("--temperature 0.8 --seed 10: bodies (-want +got):\n%s", d)
	}
	var rs []serveBenchResult
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rs) != 1 || rs[0].Temperature != 0.8 || rs[0].Seed == nil || *rs[0].Seed != 10 {
		t.Errorf("rows %+v: want temperature 0.8 and seed 10", rs)
	}

	// The late request has an index of its own: seq 3 (after the warm-up's
	// 0 and the load's 1 and 2) plus a million.
	url, bodies = fakeCompletions(t)
	if _, stderr, err := runATS(t, "bench", "--serve", url, "--concurrency", "2", "-n", "4", "--late", "--temperature", "0.5"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want = []servedBody{{f64(0.5), i64(1)}, {f64(0.5), i64(2)}, {f64(0.5), i64(3)}, {f64(0.5), i64(1_000_004)}}
	if d := cmp.Diff(want, bodies(), bySeed); d != "" {
		t.Errorf("--late, default seed: bodies (-want +got):\n%s", d)
	}

	url, bodies = fakeCompletions(t)
	out, stderr, err = runATS(t, "bench", "--serve", url, "--concurrency", "3", "-n", "4", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want = []servedBody{{f64(0), nil}, {f64(0), nil}, {f64(0), nil}, {f64(0), nil}}
	if d := cmp.Diff(want, bodies()); d != "" {
		t.Errorf("no --temperature: bodies (-want +got):\n%s", d)
	}
	if strings.Contains(out, `"seed"`) || !strings.Contains(out, `"temperature": 0`) {
		t.Errorf("no --temperature: the rows record a seed or no temperature:\n%s", out)
	}

	md, _, err := runATS(t, "bench", "--serve", url, "--concurrency", "1", "-n", "4", "--temperature", "0.8")
	if err != nil || !strings.HasPrefix(md, "temperature 0.8, ") {
		t.Errorf("markdown at temperature 0.8: %v\n%s", err, md)
	}
	if md, _, err = runATS(t, "bench", "--serve", url, "--concurrency", "1", "-n", "4"); err != nil || strings.Contains(md, "temperature") {
		t.Errorf("markdown at temperature 0: %v\n%s", err, md)
	}

	for _, tc := range []struct{ flag, want string }{
		{"--temperature=-0.5", "--temperature -0.5"},
		{"--temperature=NaN", "--temperature NaN"},
		{"--temperature=+Inf", "--temperature +Inf"},
		{"--seed=-1", "--seed -1"},
	} {
		if _, _, err := runATS(t, "bench", "--serve", url, "-n", "4", tc.flag); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to name %q", tc.flag, err, tc.want)
		}
	}
}
