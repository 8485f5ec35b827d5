package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime"
)

// evalResult is the layout of the oracle logits files, so that ats's
// output can be compared with llama.cpp's directly.
type evalResult struct {
	Prompt        []int       `json:"prompt"`
	NVocab        int         `json:"n_vocab"`
	PrefillLogits [][]float32 `json:"prefill_logits"`
	Generated     []int       `json:"generated"`
	DecodeLogits  [][]float32 `json:"decode_logits"`
}

func parseTokens(s string) ([]int, error) {
	var out []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q is not a token id", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--tokens: no token ids given")
	}
	return out, nil
}

func init() {
	register(func() *cobra.Command {
		var (
			modelPath, tokens, out, kvType string
			pf                             placementFlags
			nGen, threads, ctxSize         int
		)
		cmd := &cobra.Command{
			Use:   "eval MODEL --tokens 1,2,3 [--n-gen N] [--logits-json OUT]",
			Short: "Evaluate token ids and write the logits (for comparing runtimes)",
			Long: `eval runs the prompt tokens in one batch, then greedy-decodes N tokens one
at a time, and writes every logit as JSON in the layout of the oracle files
(prompt, n_vocab, prefill_logits, generated, decode_logits). This is how
ats's numerics are checked against llama.cpp's.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return fmt.Errorf("eval: -m MODEL is required")
				}
				prompt, err := parseTokens(tokens)
				if err != nil {
					return err
				}
				if nGen < 0 {
					return fmt.Errorf("eval: --n-gen %d is negative", nGen)
				}
				opt := runtime.ContextOptions{Threads: threads, CtxSize: ctxSize}
				if err := pf.apply(&opt, cmd.ErrOrStderr()); err != nil {
					return fmt.Errorf("eval: %w", err)
				}
				kt, err := ops.ParseKVType(kvType)
				if err != nil {
					return fmt.Errorf("eval: --kv-type: %w", err)
				}
				opt.KVType = kt
				m, err := runtime.Open(modelPath)
				if err != nil {
					return err
				}
				defer m.Close()
				if opt.CtxSize == 0 {
					opt.CtxSize = min(m.Hyper().NCtxTrain, max(4096, len(prompt)+nGen))
				}
				c, err := m.NewContext(opt)
				if err != nil {
					return err
				}
				defer c.Close()
				nv := m.Hyper().NVocab
				res := evalResult{Prompt: prompt, NVocab: nv, Generated: []int{}, DecodeLogits: [][]float32{}}
				start := time.Now()
				logits, err := c.Eval(prompt, true)
				if err != nil {
					return err
				}
				tPrefill := time.Since(start)
				for i := range prompt {
					res.PrefillLogits = append(res.PrefillLogits, logits[i*nv:(i+1)*nv])
				}
				next := ops.Argmax(logits[len(logits)-nv:])
				start = time.Now()
				for s := 0; s < nGen; s++ {
					res.Generated = append(res.Generated, next)
					l, err := c.Eval([]int{next}, false)
					if err != nil {
						return fmt.Errorf("eval: decode step %d: %w", s, err)
					}
					res.DecodeLogits = append(res.DecodeLogits, l)
					next = ops.Argmax(l)
				}
				tDecode := time.Since(start)
				where := fmt.Sprintf("%d threads", c.Threads())
				if c.Backend() == runtime.BackendGPU {
					where = "on the GPU"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s\nprefill: %d tokens in %v (%.1f t/s); decode: %d tokens in %v; %s\n",
					m, len(prompt), tPrefill.Round(time.Microsecond), float64(len(prompt))/tPrefill.Seconds(), nGen, tDecode.Round(time.Microsecond), where)
				if out == "" {
					fmt.Fprintln(cmd.OutOrStdout(), "generated:", res.Generated)
					return nil
				}
				b, err := json.Marshal(res)
				if err != nil {
					return err
				}
				if out == "-" {
					_, err = cmd.OutOrStdout().Write(append(b, '\n'))
					return err
				}
				if err := os.WriteFile(out, b, 0o644); err != nil {
					return fmt.Errorf("eval: %w", err)
				}
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.StringVar(&tokens, "tokens", "", "prompt token ids, comma separated")
		f.IntVar(&nGen, "n-gen", 0, "tokens to greedy-decode after the prompt")
		f.StringVar(&out, "logits-json", "", "write logits JSON to this file (- for stdout)")
		pf.register(f)
		f.IntVarP(&threads, "threads", "t", 0, "CPU threads (0: all cores)")
		f.IntVarP(&ctxSize, "ctx-size", "c", 0, "context size in tokens (0: enough for the prompt and n-gen)")
		f.StringVar(&kvType, "kv-type", "f16", "KV cache type: f16, q8_0, q4_0 (CPU attention) or f32")
		return cmd
	})
}
