package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/sampler"
	"github.com/atsinfer/ats/tools/synth"
)

// demo runs ats's main job end to end on a model it writes itself, so a
// fresh clone shows what ats does without downloading anything.
func init() {
	register(func() *cobra.Command {
		var (
			preset, layout, prompt, dir string
			nGen, threads               int
			keep                        bool
		)
		cmd := &cobra.Command{
			Use:   "demo",
			Short: "Synthesize a small model, inspect it and generate with it (no download needed)",
			Long: `demo writes a random-weight model in the shape of a real one into a
temporary folder, describes it as "ats inspect" does, then runs a prompt
through it and generates text, reporting prefill and decode speed. The text
is gibberish (the weights are random); the point is the whole path working.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				out := cmd.OutOrStdout()
				if dir == "" {
					tmp, err := os.MkdirTemp("", "ats-demo-")
					if err != nil {
						return err
					}
					dir = tmp
					if !keep {
						defer os.RemoveAll(tmp)
					}
				}
				path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", preset, layout))
				fmt.Fprintf(out, "== 1. synthesize %s (%s) -> %s\n", preset, layout, path)
				st, err := synth.Write(path, synth.Options{Preset: preset, Layout: layout, Seed: 1, Threads: threads})
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "wrote %d tensors, %.1f MiB, %d parameters in %v\n\n", st.Tensors, float64(st.Bytes)/(1<<20), st.Params, st.Duration.Round(time.Millisecond))

				fmt.Fprintf(out, "== 2. inspect\n")
				inspect := newRootCmd()
				inspect.SetOut(out)
				inspect.SetErr(cmd.ErrOrStderr())
				inspect.SetArgs([]string{"inspect", "--tensors=false", path})
				if err := inspect.Execute(); err != nil {
					return err
				}

				fmt.Fprintf(out, "\n== 3. generate (CPU; random weights, so the text is noise)\n")
				m, err := model.Open(path)
				if err != nil {
					return err
				}
				defer m.Close()
				s, err := session.NewSession(m, session.Options{Threads: threads, CtxSize: 512}, func(w string) { fmt.Fprintln(cmd.ErrOrStderr(), "ats: warning:", w) })
				if err != nil {
					return err
				}
				defer s.Close()
				ids := s.Tok.Encode(prompt, s.Tok.AddBOS(), false)
				cfg := sampler.DefaultConfig()
				cfg.Seed = 42
				fmt.Fprintf(out, "prompt %q -> %d tokens\n", prompt, len(ids))
				res, err := s.Generate(context.Background(), ids, session.GenerateOptions{Sampler: cfg, MaxTokens: nGen})
				if err != nil && !errors.Is(err, session.ErrContextFull) {
					return err
				}
				fmt.Fprintf(out, "generated %d tokens: %q\n", len(res.Tokens), res.Text)
				fmt.Fprintf(out, "prefill %.1f t/s, decode %.1f t/s on %d threads\n", res.PrefillRate(), res.DecodeRate(), s.Ctx.Threads())
				if keep {
					fmt.Fprintf(out, "\nthe model is kept at %s; try: ats run -m %s --raw -p 'hello'\n", path, path)
				}
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVar(&preset, "preset", "tiny-qwen3", "model shape (see: ats synth --list)")
		f.StringVar(&layout, "layout", "q4_k_m", "weight layout: f32, f16, q8_0 or q4_k_m")
		f.StringVarP(&prompt, "prompt", "p", "The quick brown fox", "prompt text")
		f.IntVarP(&nGen, "n-gen", "n", 32, "tokens to generate")
		f.IntVarP(&threads, "threads", "t", 0, "CPU threads (0: all cores)")
		f.StringVar(&dir, "dir", "", "write the model here instead of a temporary folder")
		f.BoolVar(&keep, "keep", false, "keep the synthesized model")
		return cmd
	})
}
