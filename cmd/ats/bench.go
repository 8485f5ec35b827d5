package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
)

// benchResult is one test of `ats bench`, with llama-bench's JSON field
// names so the two tools' outputs can be compared by the same scripts.
type benchResult struct {
	Build       string    `json:"build_commit"`
	CPUInfo     string    `json:"cpu_info"`
	CPULevel    string    `json:"cpu_level"`
	Backend     string    `json:"backends"`
	ModelFile   string    `json:"model_filename"`
	ModelType   string    `json:"model_type"`
	ModelSize   int64     `json:"model_size"`
	ModelParams int64     `json:"model_n_params"`
	NBatch      int       `json:"n_batch"`
	NThreads    int       `json:"n_threads"`
	NPrompt     int       `json:"n_prompt"`
	NGen        int       `json:"n_gen"`
	NDepth      int       `json:"n_depth"`
	NParallel   int       `json:"n_parallel,omitempty"` // tg: sequences decoding together (1: omitted)
	TypeK       string    `json:"type_k"`               // the KV cache's types
	TypeV       string    `json:"type_v"`
	Test        string    `json:"test"`
	Time        string    `json:"test_time"`
	AvgNs       int64     `json:"avg_ns"`
	StddevNs    int64     `json:"stddev_ns"`
	AvgTs       float64   `json:"avg_ts"`
	StddevTs    float64   `json:"stddev_ts"`
	SamplesNs   []int64   `json:"samples_ns"`
	SamplesTs   []float64 `json:"samples_ts"`
	WeightGBps  float64   `json:"weight_gbps,omitempty"`  // tg only: weight bytes read per second
	Placement   string    `json:"placement,omitempty"`    // where the units live (GPU contexts)
	PredictedTs float64   `json:"predicted_ts,omitempty"` // what the placement's cost model expects
	VRAMBudget  int64     `json:"vram_budget_bytes,omitempty"`
	VRAMUsed    int64     `json:"vram_used_bytes,omitempty"`    // NVML: this process less the CUDA context
	VRAMContext int64     `json:"vram_context_bytes,omitempty"` // the CUDA context and modules, apart
	HostRSS     int64     `json:"host_rss_bytes,omitempty"`     // resident host memory at the end of the test (Linux)
	Repacked    int64     `json:"repacked_bytes,omitempty"`     // of which repacked CPU copies of weights
	// DecodeCPUMs and DecodeGPUMs split a decode step's wall time (tg of
	// mixed placements): CPU segments, and GPU segments with their waits.
	DecodeCPUMs float64 `json:"decode_cpu_ms,omitempty"`
	DecodeGPUMs float64 `json:"decode_gpu_ms,omitempty"`
	Promotion   string  `json:"promotion,omitempty"` // dynamic promotion's summary
	// SplitLayers is the MoE layers a prefill batch split between the CPU
	// and the GPU; SplitHostMs and SplitWaitMs the CPU's time on its share
	// of one, and waiting for its routing.
	SplitLayers int     `json:"split_layers,omitempty"`
	SplitHostMs float64 `json:"split_host_ms,omitempty"`
	// SplitSlots is the fraction of the split layers' routed slots the
	// CPU's experts took; SplitThreads how many threads were busy on
	// average while the CPU computed its shares (0: not measured).
	SplitSlots   float64 `json:"split_slots,omitempty"`
	SplitThreads float64 `json:"split_threads,omitempty"`
	SplitWaitMs  float64 `json:"split_wait_ms,omitempty"`
	// SplitExperts is the CPU's experts of a split layer, SplitRouted how
	// many of them the batch's routing used, on average over the layers.
	SplitExperts float64 `json:"split_experts,omitempty"`
	SplitRouted  float64 `json:"split_routed,omitempty"`
	// Decode's routed MoE layers (the GPU takes a share of the experts a
	// step's tokens chose): per decode step, and per layer the experts
	// the GPU and the CPU took, and the CPU's time waiting for the
	// routing and computing its share.
	RoutedLayers        float64 `json:"routed_layers,omitempty"`
	RoutedGPUExperts    float64 `json:"routed_gpu_experts,omitempty"`
	RoutedCPUExperts    float64 `json:"routed_cpu_experts,omitempty"`
	RoutedWaitMs        float64 `json:"routed_wait_ms,omitempty"`
	RoutedHostMs        float64 `json:"routed_host_ms,omitempty"`
	RoutedCopiedPerStep int64   `json:"routed_copied_bytes,omitempty"`
	// The floor of a hybrid prompt whose batches stream (pp): per prompt,
	// the host-resident weights the link carried (StreamedGB, at LinkGBps,
	// the profile's copy rate) and the CPU's shares of split MoE layers
	// read (ShareGB, at ShareGBps, measured); FloorTs is the speed no
	// prompt of the same bytes can beat with those two rates (prefillFloor).
	StreamedGB  float64 `json:"streamed_gb,omitempty"`
	ShareGB     float64 `json:"share_gb,omitempty"`
	LinkGBps    float64 `json:"link_gbps,omitempty"`
	ShareGBps   float64 `json:"share_gbps,omitempty"`
	FloorTs     float64 `json:"floor_ts,omitempty"`
	modelPretty string
}

// benchOptions are the flags of `ats bench`.
type benchOptions struct {
	models   []string
	prompts  []int
	gens     []int
	depths   []int
	threads  []int
	parallel []int // tg: sequences decoding together
	reps     int
	batch    int
	ctx      int // KV cache positions to reserve at least (a server's -c)
	output   string
	noWarmup bool
	progress bool
	place    placementFlags
	stress   string // cpu=PCT or gpu=PCT: the load experiment instead of the tests
	serve    serveBenchOptions
}

func init() {
	register(func() *cobra.Command {
		var o benchOptions
		var prompts, gens, depths, threads, parallel, concurrency string
		cmd := &cobra.Command{
			Use:   "bench MODEL... [-p 512] [-n 128] [-r 5] [-t THREADS] [-o md|json|csv]",
			Short: "Measure prompt processing and generation speed, like llama-bench",
			Long: `bench measures tokens per second of prompt processing (pp: N random
tokens in one batch from an empty cache) and of text generation (tg: N
tokens one at a time from an empty cache), each repeated -r times after one
warm-up run, and reports the mean and standard deviation over the
repetitions, the way llama-bench does (its output formats and JSON field
names too, so the two tools' results can be put side by side).

-d N (llama-bench's --n-depth) runs each test after N tokens of context:
the N tokens are evaluated once, untimed, and every run starts from them
(pp512 @ d4096: 512 prompt tokens at positions 4096..4607).

--parallel N runs tg with N sequences decoding together, as a server's N
slots do (llama-batched-bench's -npl): each step computes one random token
of every sequence in one batch, each sequence after its own -d tokens of
context, and t/s counts the tokens of all N (tg128 x4: 4 x 128 tokens).
Random tokens route a mixture of experts' sequences apart, as sampled
requests of a real model do.

-p, -n, -d, -t and --parallel take comma-separated lists; -p 0 or -n 0
skips that test.

--serve URL loads a running OpenAI-compatible server instead (ats serve,
llama-server, ...): at each --concurrency C, C streamed completions of -n
tokens (the first value) start together, at temperature 0 (see below)
with ignore_eos, after one warm-up request; -p sets about how many prompt
tokens each has (default: a short prompt). It prints the aggregate tokens
per second, time to first token and time per output token at p50 and p99,
and the mean rate of a request; --late also times a request that arrives
while the others decode; -o json gives every request's figures.

--temperature T > 0 samples instead of decoding greedily, request i of the
run (0: the warm-up) with seed S+i, S from --seed (1 unless given): the
runs repeat and the requests differ. On a model of random weights, greedy
requests soon all emit the same token, so a mixture of experts' batch
routes every sequence to the same experts and reads as few weights as one
sequence does: a concurrency figure that flatters.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				var err error
				if o.prompts, err = parseIntList("-p", prompts, 0); err != nil {
					return err
				}
				if o.gens, err = parseIntList("-n", gens, 0); err != nil {
					return err
				}
				if o.depths, err = parseIntList("-d", depths, 0); err != nil {
					return err
				}
				if o.threads, err = parseIntList("-t", threads, 1); err != nil {
					return err
				}
				if o.parallel, err = parseIntList("--parallel", parallel, 1); err != nil {
					return err
				}
				if cmd.Flags().Changed("parallel") && (o.serve.url != "" || o.stress != "") {
					return fmt.Errorf("bench: --parallel runs the model's own tg tests; with --serve, --concurrency sets the requests at once, and --stress decodes one sequence")
				}
				if o.serve.url != "" {
					if t := o.serve.temperature; math.IsNaN(t) || math.IsInf(t, 0) || t < 0 {
						return fmt.Errorf("bench --serve: --temperature %v: must be a finite number from 0 up (0: greedy)", t)
					}
					if o.serve.seed < 0 || o.serve.seed > math.MaxInt32 {
						// llama-server reads a seed as 32 bits: S+i must not wrap.
						return fmt.Errorf("bench --serve: --seed %d: must be from 0 to %d", o.serve.seed, math.MaxInt32)
					}
					if o.serve.concurrency, err = parseIntList("--concurrency", concurrency, 1); err != nil {
						return err
					}
					o.serve.tokens = o.gens[0]
					if o.serve.tokens < 1 {
						return fmt.Errorf("bench --serve: -n %d: the requests must generate tokens", o.serve.tokens)
					}
					if cmd.Flags().Changed("n-prompt") {
						o.serve.promptTokens = o.prompts[0]
					}
					if o.output == "csv" {
						return fmt.Errorf("bench --serve: -o csv: want md or json")
					}
					if len(o.models) > 0 {
						return fmt.Errorf("bench --serve measures the server's model: give no -m")
					}
					return runServeBench(cmd.OutOrStdout(), cmd.ErrOrStderr(), o.serve, o.output)
				}
				if len(o.models) == 0 {
					return fmt.Errorf("bench: -m MODEL is required")
				}
				if o.reps < 1 {
					return fmt.Errorf("bench: -r %d: need at least one repetition", o.reps)
				}
				switch o.output {
				case "md", "json", "csv":
				default:
					return fmt.Errorf("bench: -o %q: want md, json or csv", o.output)
				}
				return runBench(cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
			},
		}
		f := cmd.Flags()
		f.StringSliceVarP(&o.models, "model", "m", nil, "GGUF model file (repeat or comma-separate for several)")
		f.StringVarP(&prompts, "n-prompt", "p", "512", "prompt lengths to test (comma separated; 0: none)")
		f.StringVarP(&gens, "n-gen", "n", "128", "generation lengths to test (comma separated; 0: none)")
		f.StringVarP(&depths, "n-depth", "d", "0", "tokens of context before each test (comma separated; llama-bench's -d)")
		f.StringVarP(&threads, "threads", "t", strconv.Itoa(ops.DefaultThreads()), "CPU threads (comma separated)")
		f.StringVar(&parallel, "parallel", "1", "tg: sequences decoding together, one token of each a step (comma separated; llama-batched-bench's -npl)")
		f.IntVarP(&o.reps, "repetitions", "r", 5, "repetitions of each test")
		f.IntVarP(&o.batch, "batch-size", "b", 512, "most prompt tokens computed together")
		f.IntVarP(&o.ctx, "ctx-size", "c", 0, "KV cache positions to reserve, as a server's -c does, so that the placement leaves them room (0: what each test needs)")
		f.StringVarP(&o.output, "output", "o", "md", "`FORMAT`: output format: md, json or csv")
		f.BoolVar(&o.noWarmup, "no-warmup", false, "skip the warm-up run")
		f.BoolVar(&o.progress, "progress", false, "print each run to stderr as it finishes")
		o.place.register(f)
		f.StringVar(&o.serve.url, "serve", "", "load the OpenAI-compatible server at this URL instead of running a model (http://127.0.0.1:8080)")
		f.StringVar(&concurrency, "concurrency", "1,4,8,16", "with --serve: requests at once (comma separated)")
		f.StringVar(&o.serve.apiKey, "api-key", "", "with --serve: the server's API key")
		f.StringVar(&o.serve.model, "served-model", "", "with --serve: the model field of the requests (servers of several models)")
		f.BoolVar(&o.serve.late, "late", false, "with --serve: also time the first token of a request that arrives while the others decode")
		f.DurationVar(&o.serve.timeout, "timeout", 30*time.Minute, "with --serve: the longest a request may take")
		f.Float64Var(&o.serve.temperature, "temperature", 0, "with --serve: the requests' temperature (0: greedy; above 0, request i also gets seed --seed + i)")
		f.Int64Var(&o.serve.seed, "seed", 1, "with --serve and --temperature above 0: the seed of request 0 (the warm-up); request i gets this + i")
		f.StringVar(&o.stress, "stress", "", "load experiment: decode (tg of -n) static and with dynamic promotion, each with and without a competing load: cpu=PCT (busy threads on that share of the cores) or gpu=PCT (GPU memory and link busy that share of the time)")
		return cmd
	})
}

// parseIntList reads "512,1024"; every value must be >= lo.
func parseIntList(flag, s string, lo int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < lo {
			return nil, fmt.Errorf("bench: %s: %q is not a number >= %d", flag, f, lo)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("bench: %s: no values", flag)
	}
	return out, nil
}

func runBench(stdout, stderr io.Writer, o benchOptions) error {
	if n := ops.CPUNote(); n != "" {
		fmt.Fprintln(stderr, "note:", n)
	}
	var results []benchResult
	md := o.output == "md" && o.stress == ""
	if o.stress != "" && o.gens[0] <= 0 {
		return fmt.Errorf("bench: --stress measures decode: give -n tokens")
	}
	if md {
		printMarkdownHeader(stdout)
	}
	for _, path := range o.models {
		m, err := model.Open(path)
		if err != nil {
			return err
		}
		info := describeModel(m, path)
		weights, err := cpu.NewWeights(m.Prog) // kept across the tests: their repacked copies too
		if err != nil {
			m.Close()
			return err
		}
		if o.stress != "" {
			kind, pct, err := parseStress(o.stress)
			if err != nil {
				m.Close()
				return err
			}
			for _, th := range o.threads {
				if err := stressBench(stdout, stderr, m, o, th, o.gens[0], kind, pct); err != nil {
					m.Close()
					return err
				}
			}
			m.Close()
			continue
		}
		for _, th := range o.threads {
			var tests []benchResult
			for _, d := range o.depths {
				at := ""
				if d > 0 {
					at = fmt.Sprintf(" @ d%d", d) // llama-bench's name of a test at depth
				}
				for _, p := range o.prompts {
					if p > 0 {
						tests = append(tests, benchResult{NPrompt: p, NDepth: d, Test: fmt.Sprintf("pp%d%s", p, at)})
					}
				}
				for _, n := range o.gens {
					for _, np := range o.parallel {
						if n > 0 {
							r := benchResult{NGen: n, NDepth: d, Test: fmt.Sprintf("tg%d%s", n, at)}
							if np > 1 {
								r.NParallel, r.Test = np, fmt.Sprintf("tg%d x%d%s", n, np, at)
							}
							tests = append(tests, r)
						}
					}
				}
			}
			for _, r := range tests {
				fillCommon(&r, info, th, o.batch)
				if err := benchOne(m, weights, &r, o, stderr); err != nil {
					m.Close()
					return err
				}
				if r.Placement != "" {
					fmt.Fprintf(stderr, "ats: %s: %s", r.Test, r.Placement)
					if r.PredictedTs > 0 {
						fmt.Fprintf(stderr, "; the cost model predicts %.1f t/s, measured %.1f", r.PredictedTs, r.AvgTs)
					}
					if r.DecodeCPUMs > 0 {
						fmt.Fprintf(stderr, "; a decode step: %.2f ms in CPU segments, %.2f ms in GPU segments and waits", r.DecodeCPUMs, r.DecodeGPUMs)
					}
					if r.RoutedLayers > 0 {
						fmt.Fprintf(stderr, "; a decode step routes %.0f MoE layers: the GPU takes %.1f of a layer's chosen experts (%.1f MB a step over the link), the CPU %.1f in %.2f ms after %.2f ms waiting for the routing",
							r.RoutedLayers, r.RoutedGPUExperts, float64(r.RoutedCopiedPerStep)/1e6, r.RoutedCPUExperts, r.RoutedHostMs, r.RoutedWaitMs)
					}
					if r.SplitLayers > 0 {
						fmt.Fprintf(stderr, "; a batch splits %d MoE layers with the CPU, its share (%.1f%% of the routed slots, %.1f of its %.0f experts used) %.2f ms each after %.2f ms waiting for the routing", r.SplitLayers, 100*r.SplitSlots, r.SplitRouted, r.SplitExperts, r.SplitHostMs, r.SplitWaitMs)
						if r.SplitThreads > 0 {
							fmt.Fprintf(stderr, ", %.1f threads busy on it", r.SplitThreads)
						}
					}
					if r.FloorTs > 0 {
						fmt.Fprintf(stderr, "; a prompt moved %.2f GB of host-resident weights over the link (%.1f GB/s in the profile)", r.StreamedGB, r.LinkGBps)
						if r.ShareGB > 0 {
							fmt.Fprintf(stderr, " and the CPU's shares read %.2f GB (at %.1f GB/s)", r.ShareGB, r.ShareGBps)
						}
						fmt.Fprintf(stderr, ": with those rates no prompt of these bytes beats %.0f t/s", r.FloorTs)
					}
					if r.Promotion != "" && r.NGen > 0 {
						fmt.Fprintf(stderr, "; %s", r.Promotion)
					}
					if r.VRAMUsed > 0 {
						fmt.Fprintf(stderr, "; VRAM in use %s of the budget %s (CUDA context %s apart)",
							executor.FormatBytes(r.VRAMUsed), executor.FormatBytes(r.VRAMBudget), executor.FormatBytes(r.VRAMContext))
					}
					if r.HostRSS > 0 {
						fmt.Fprintf(stderr, "; host RSS %s (weights %s; repacked CPU copies %s",
							executor.FormatBytes(r.HostRSS), executor.FormatBytes(m.WeightBytes()), executor.FormatBytes(r.Repacked))
						if lo, hi := weights.RepackedExperts(); hi > 0 {
							fmt.Fprintf(stderr, ", of MoE stacks the first %d-%d experts", lo, hi)
						}
						fmt.Fprint(stderr, ")")
					}
					fmt.Fprintln(stderr)
					if note := routingNote(&r); note != "" {
						fmt.Fprintln(stderr, "ats: note:", note)
					}
				}
				if md {
					printMarkdownRow(stdout, &r)
				}
				results = append(results, r)
			}
		}
		m.Close()
	}
	switch o.output {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if results == nil {
			results = []benchResult{}
		}
		return enc.Encode(results)
	case "csv":
		return writeCSV(stdout, results)
	}
	if md {
		fmt.Fprintf(stdout, "\nbuild: %s (%s), CPU kernels: %s\n", results0(results).Build, goVersion(), ops.CPUKernels())
	}
	return nil
}

// prefillFloor is the least time a prompt can take whose batches stream
// streamed bytes of host-resident weights to the GPU over a link of link
// bytes/s while the CPU's shares read share bytes in shareTime: every
// such byte goes over the link or through the CPU, and at best the two
// split them in proportion to their rates, both busy throughout. It
// leaves out the GPU's compute, the waits between them and the first
// copies, so a measured prompt lies above it; 0 when there is no link
// rate or nothing to move.
func prefillFloor(streamed, share int64, link float64, shareTime time.Duration) time.Duration {
	if link <= 0 || streamed+share <= 0 {
		return 0
	}
	rate := link
	if share > 0 && shareTime > 0 {
		rate += float64(share) / shareTime.Seconds()
	}
	return time.Duration(float64(streamed+share) / rate * float64(time.Second))
}

// routingNote warns when a prompt of many tokens used under half of the
// CPU's experts of its split layers: a trained router spreads such a
// prompt over nearly all of them (with 8 of 128 experts a token, 128
// evenly routed tokens leave a given expert without a slot with a chance
// of 3e-4), a random model's crowds onto a few, and the split's figures
// then say little about a real model's.
func routingNote(r *benchResult) string {
	if r.NPrompt < 128 || r.SplitExperts == 0 || r.SplitRouted >= r.SplitExperts/2 {
		return ""
	}
	return fmt.Sprintf("the routing used %.1f of the CPU's %.0f experts a split layer: it crowds onto a few, as a random model's does, where a trained model's spreads over nearly all (ats synth --routing balanced writes a model whose does)", r.SplitRouted, r.SplitExperts)
}

func results0(r []benchResult) benchResult {
	if len(r) == 0 {
		return benchResult{Build: buildCommit()}
	}
	return r[0]
}

// modelInfo is what the report says about a model.
type modelInfo struct {
	file, pretty, typ string
	size, params      int64
	weightBytes       int64
}

func describeModel(m *model.Model, path string) modelInfo {
	var size, params int64
	for _, t := range m.File.Tensors {
		size += int64(t.Size)
		params += int64(t.Elements())
	}
	h := m.Hyper()
	ft := "?"
	if v, err := m.File.Uint("general.file_type"); err == nil {
		ft = fileTypeName(v)
	}
	label := sizeLabel(m, params)
	return modelInfo{
		file:        path,
		typ:         fmt.Sprintf("%s %s %s", h.Arch, label, ft),
		pretty:      fmt.Sprintf("%s %s %s", h.Arch, label, ft),
		size:        size,
		params:      params,
		weightBytes: m.WeightBytes(),
	}
}

// sizeLabel is the model's size as llama-bench prints it (0.6B, 14B, 30B):
// general.size_label when the file has one, else the parameter count in
// billions, whole ones rounded down (llama.cpp names by architecture size
// class, which rounding down matches for the usual models).
func sizeLabel(m *model.Model, params int64) string {
	if s, err := m.File.String("general.size_label"); err == nil && s != "" {
		return s
	}
	b := float64(params) / 1e9
	if b >= 1 {
		return fmt.Sprintf("%.0fB", math.Floor(b))
	}
	return fmt.Sprintf("%.1fB", b)
}

// fileTypeName is llama.cpp's name of general.file_type (llama_ftype).
func fileTypeName(v uint64) string {
	names := map[uint64]string{
		0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
		10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
		14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium",
		18: "Q6_K", 32: "BF16",
	}
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("ftype %d", v)
}

func fillCommon(r *benchResult, info modelInfo, threads, batch int) {
	r.Build = buildCommit()
	r.CPUInfo = cpuName()
	r.CPULevel = ops.CPUKernels()
	r.Backend = "CPU"
	r.ModelFile = info.file
	r.ModelType = info.typ
	r.ModelSize = info.size
	r.ModelParams = info.params
	r.NBatch = batch
	r.NThreads = threads
	r.Time = time.Now().UTC().Format(time.RFC3339)
	r.modelPretty = info.pretty
	if r.NGen > 0 {
		r.WeightGBps = float64(info.weightBytes) / 1e9 // times tokens/s below
	}
}

// benchOne runs one test: a warm-up, then o.reps timed runs, each from
// the test's depth (an empty cache, or NDepth random tokens evaluated
// once) with fresh random tokens.
func benchOne(m *model.Model, weights *cpu.Weights, r *benchResult, o benchOptions, stderr io.Writer) error {
	h := m.Hyper()
	// A server reserves its whole cache in the budget; -c lets a test
	// place the model as that server would.
	seqs, blk := max(r.NParallel, 1), kvcache.DefaultBlock
	need := r.NDepth + r.NPrompt + r.NGen
	if seqs > 1 {
		need = seqs * (need + blk - 1) / blk * blk // each sequence holds whole blocks
	}
	ctxSize := max(need, o.ctx)
	copt := session.Options{Threads: r.NThreads, CtxSize: ctxSize, Batch: o.batch, Weights: weights}
	if err := o.place.apply(&copt, stderr); err != nil {
		return err
	}
	r.TypeK, r.TypeV = copt.KVType.String(), copt.KVType.String()
	c, err := session.NewEngine(m, copt)
	if err != nil {
		return err
	}
	defer c.Close()
	if seqs > 1 && !c.MultiSequence() {
		return fmt.Errorf("bench: --parallel %d: this backend computes one sequence a step", seqs)
	}
	if seqs > c.Ctx.LogitRows() {
		return fmt.Errorf("bench: --parallel %d: a step computes at most %d sequences' logits (raise -b)", seqs, c.Ctx.LogitRows())
	}
	all := make([]*kvcache.Seq, seqs)
	for i := range all {
		all[i] = c.Ctx.KV().NewSeq()
		defer all[i].Close()
	}
	seq := all[0]
	switch c.Backend() {
	case executor.BackendGPU:
		r.Backend = "CUDA" // llama-bench's name for it
	case executor.BackendHybrid:
		r.Backend = "CPU+CUDA"
	}
	if pl := c.Placement; c.Backend() != executor.BackendCPU {
		r.Placement = pl.Describe()
		if p := pl.Predicted; p != nil {
			r.PredictedTs = p.DecodeTokensPerS
			if r.NPrompt > 0 && p.PrefillStepSeconds > 0 {
				r.PredictedTs = p.PrefillTokensPerS
			}
		}
	}
	rng := rand.New(rand.NewPCG(uint64(ctxSize), uint64(r.NThreads)))
	tokens := func(n int) []int {
		t := make([]int, n)
		for i := range t {
			t[i] = rng.IntN(h.NVocab)
		}
		return t
	}
	if r.NDepth > 0 {
		for i, s := range all {
			if _, err := c.Eval(s, tokens(r.NDepth), false); err != nil {
				return fmt.Errorf("bench: sequence %d: the %d tokens of depth: %w", i, r.NDepth, err)
			}
		}
	}
	run := func(warm bool) (time.Duration, error) {
		for _, s := range all {
			s.Truncate(r.NDepth)
		}
		if r.NPrompt > 0 {
			toks := tokens(r.NPrompt)
			start := time.Now()
			if _, err := c.Eval(seq, toks, false); err != nil {
				return 0, err
			}
			return time.Since(start), nil
		}
		n := r.NGen
		if warm {
			n = 1 // llama-bench warms generation up with one token
		}
		if seqs > 1 {
			toks := make([][]int, n)
			for i := range toks {
				toks[i] = tokens(seqs)
			}
			start := time.Now()
			for _, t := range toks {
				if _, err := c.Decode(all, t); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
		toks := tokens(n)
		start := time.Now()
		for _, t := range toks {
			if _, err := c.Eval(seq, []int{t}, false); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	defer func() {
		if v := c.VRAM(); v.Allocated > 0 {
			r.VRAMBudget, r.VRAMUsed, r.VRAMContext = v.Budget, v.Process, v.Context
		}
		r.HostRSS, r.Repacked = residentBytes(), weights.RepackedBytes()
		if pr := c.Promoter.Stats(); pr.On {
			r.Promotion = describePromotion(pr)
		}
		st := c.Ctx.Stats()
		if st.Split.Layers > 0 && st.Steps > st.DecodeSteps {
			batches := float64(st.Steps - st.DecodeSteps)
			r.SplitLayers = int(math.Round(float64(st.Split.Layers) / batches))
			r.SplitHostMs = float64(st.Split.Host.Microseconds()) / 1e3 / float64(st.Split.Layers)
			r.SplitWaitMs = float64(st.Split.Wait.Microseconds()) / 1e3 / float64(st.Split.Layers)
			r.SplitSlots = float64(st.Split.HostSlots) / float64(max(st.Split.Slots, 1))
			r.SplitExperts = float64(st.Split.HostExperts) / float64(st.Split.Layers)
			r.SplitRouted = float64(st.Split.HostRouted) / float64(st.Split.Layers)
			if st.Split.Host > 0 {
				r.SplitThreads = st.Split.HostCPU.Seconds() / st.Split.Host.Seconds()
			}
		}
		if sp := st.Split; sp.RoutedLayers > 0 && st.DecodeSteps > 0 {
			l := float64(sp.RoutedLayers)
			r.RoutedLayers = l / float64(st.DecodeSteps)
			r.RoutedGPUExperts, r.RoutedCPUExperts = float64(sp.DeviceExperts)/l, float64(sp.RoutedHostExperts)/l
			r.RoutedWaitMs, r.RoutedHostMs = sp.RoutedWait.Seconds()*1e3/l, sp.RoutedHost.Seconds()*1e3/l
			r.RoutedCopiedPerStep = sp.CopiedBytes / int64(st.DecodeSteps)
		}
		if prompts := int64(o.reps); r.NPrompt > 0 && st.DecodeSteps == 0 && c.Backend() == executor.BackendHybrid && prompts > 0 {
			if !o.noWarmup {
				prompts++
			}
			streamed, share := st.Streamed/prompts, st.Split.HostBytes/prompts
			shareTime := st.Split.Host / time.Duration(prompts)
			if floor := prefillFloor(streamed, share, c.Placement.LinkRate(), shareTime); floor > 0 {
				r.StreamedGB, r.ShareGB, r.LinkGBps = float64(streamed)/1e9, float64(share)/1e9, c.Placement.LinkRate()/1e9
				if shareTime > 0 {
					r.ShareGBps = float64(share) / 1e9 / shareTime.Seconds()
				}
				r.FloorTs = float64(r.NPrompt) / floor.Seconds()
			}
		}
		if st.DecodeSteps > 0 && c.Backend() == executor.BackendHybrid {
			r.DecodeCPUMs = float64(st.DecodeHost.Microseconds()) / 1e3 / float64(st.DecodeSteps)
			r.DecodeGPUMs = float64(st.DecodeDevice.Microseconds()) / 1e3 / float64(st.DecodeSteps)
		}
	}()
	if !o.noWarmup {
		if _, err := run(true); err != nil {
			return err
		}
	}
	nTok := r.NPrompt + r.NGen*seqs
	for i := 0; i < o.reps; i++ {
		debug.FreeOSMemory() // no collector work from earlier runs inside the timing
		d, err := run(false)
		if err != nil {
			return err
		}
		r.SamplesNs = append(r.SamplesNs, d.Nanoseconds())
		r.SamplesTs = append(r.SamplesTs, float64(nTok)/d.Seconds())
		if o.progress {
			fmt.Fprintf(stderr, "%s t=%d run %d/%d: %.2f t/s\n", r.Test, r.NThreads, i+1, o.reps, float64(nTok)/d.Seconds())
		}
	}
	ns := make([]float64, len(r.SamplesNs))
	for i, v := range r.SamplesNs {
		ns[i] = float64(v)
	}
	avgNs, sdNs := meanStddev(ns)
	r.AvgNs, r.StddevNs = int64(avgNs), int64(sdNs)
	r.AvgTs, r.StddevTs = meanStddev(r.SamplesTs)
	if r.NGen > 0 {
		r.WeightGBps *= r.AvgTs / float64(seqs) // a step reads the weights once for all its sequences
	}
	return nil
}

// meanStddev is the mean and the sample standard deviation (n-1), as
// llama-bench reports them; one sample has deviation 0.
func meanStddev(v []float64) (mean, sd float64) {
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	for _, x := range v {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(v)-1))
}

func printMarkdownHeader(w io.Writer) {
	fmt.Fprintln(w, "| model | size | params | backend | threads | test | t/s |")
	fmt.Fprintln(w, "| --- | ---: | ---: | --- | ---: | ---: | ---: |")
}

func printMarkdownRow(w io.Writer, r *benchResult) {
	backend := "CPU (" + r.CPULevel + ")"
	if r.Backend != "CPU" {
		backend = r.Backend
	}
	fmt.Fprintf(w, "| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f |\n",
		r.modelPretty, float64(r.ModelSize)/(1<<30), float64(r.ModelParams)/1e9, backend, r.NThreads, r.Test, r.AvgTs, r.StddevTs)
}

func writeCSV(w io.Writer, rs []benchResult) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"build_commit", "cpu_info", "cpu_level", "backends", "model_filename", "model_type", "model_size", "model_n_params",
		"n_batch", "n_threads", "n_prompt", "n_gen", "n_depth", "test", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "type_k", "type_v"})
	for _, r := range rs {
		cw.Write([]string{r.Build, r.CPUInfo, r.CPULevel, r.Backend, r.ModelFile, r.ModelType,
			strconv.FormatInt(r.ModelSize, 10), strconv.FormatInt(r.ModelParams, 10),
			strconv.Itoa(r.NBatch), strconv.Itoa(r.NThreads), strconv.Itoa(r.NPrompt), strconv.Itoa(r.NGen), strconv.Itoa(r.NDepth), r.Test, r.Time,
			strconv.FormatInt(r.AvgNs, 10), strconv.FormatInt(r.StddevNs, 10),
			strconv.FormatFloat(r.AvgTs, 'f', 6, 64), strconv.FormatFloat(r.StddevTs, 'f', 6, 64), r.TypeK, r.TypeV})
	}
	cw.Flush()
	return cw.Error()
}

func buildCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 7 {
				return s.Value[:7]
			}
		}
	}
	return version
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "go"
}

// cpuName is the CPU model from /proc/cpuinfo where there is one.
func cpuName() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return filepath.Base(os.Args[0])
}
