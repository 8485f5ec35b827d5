package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

func init() {
	register(func() *cobra.Command {
		var (
			modelPath, prompt, system string
			promptFile                string
			pf                        placementFlags
			raw, printTokens, special bool
			think                     bool
			nPredict, ctxSize, thrds  int
			sf                        samplingFlags
		)
		cmd := &cobra.Command{
			Use:   "run MODEL [-p PROMPT | -f FILE]",
			Short: "Generate a reply to one prompt, streamed to stdout",
			Long: `run applies the model's chat template to the prompt (unless --raw), then
streams the generated text to stdout and prints prefill and decode speed to
stderr. Without -p or -f the prompt is read from standard input; when that
is a terminal, run starts an interactive chat instead (as ats chat does).
MODEL (or -m MODEL) is a GGUF file or the name of a pulled model.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return errors.New("run: -m MODEL is required")
				}
				switch {
				case promptFile != "" && cmd.Flags().Changed("prompt"):
					return errors.New("run: give the prompt once: -p or -f")
				case promptFile != "":
					b, err := readPromptFile(cmd, promptFile)
					if err != nil {
						return err
					}
					prompt = strings.TrimRight(string(b), "\n")
				case !cmd.Flags().Changed("prompt") && stdinIsTerminal(cmd) && isTerminal(cmd.OutOrStdout()):
					return runAsChat(cmd)
				case !cmd.Flags().Changed("prompt"):
					if stdinIsTerminal(cmd) { // the reply goes to a file or a pipe
						fmt.Fprintln(cmd.ErrOrStderr(), "ats: type the prompt, then Ctrl-D (or give it with -p or -f)")
					}
					b, err := io.ReadAll(cmd.InOrStdin())
					if err != nil {
						return fmt.Errorf("run: reading the prompt from stdin: %w", err)
					}
					prompt = strings.TrimRight(string(b), "\n")
				}
				if strings.TrimSpace(prompt) == "" {
					return errors.New("run: the prompt is empty: give it with -p, -f or on standard input")
				}
				cfg, err := sf.config()
				if err != nil {
					return err
				}
				stderr := cmd.ErrOrStderr()
				warn := func(s string) { fmt.Fprintln(stderr, "ats: warning:", s) }
				// Loading shows its progress and time, so the prompt speed
				// below is the prompt's alone.
				copt := session.Options{CtxSize: ctxSize, Threads: thrds}
				if err := pf.apply(&copt, stderr); err != nil {
					return err
				}
				s, err := loadSession(modelPath, copt, stderr, warn)
				if err != nil {
					return err
				}
				defer s.Model.Close()
				defer s.Close()
				if err := checkRepeatWindow(cfg.RepeatLastN, s.CtxSize()); err != nil {
					return fmt.Errorf("run: --repeat-last-n: %w", err)
				}
				// A prompt the context cannot hold is refused as soon as
				// that is known, before its tokens take memory.
				limit := s.CtxSize() - 1
				var ids []int
				if raw {
					ids, err = s.Tok.EncodeWith(prompt, tokenizer.EncodeOptions{AddBOS: s.Tok.AddBOS(), MaxTokens: limit})
				} else {
					var msgs []chat.Message
					if system != "" {
						msgs = append(msgs, chat.Message{Role: "system", Content: system})
					}
					msgs = append(msgs, chat.Message{Role: "user", Content: prompt})
					opt := chat.Options{AddGenerationPrompt: true}
					if cmd.Flags().Changed("think") {
						opt.Vars = map[string]any{"enable_thinking": think}
					}
					var p chat.Prompt
					if p, err = s.RenderPrompt(msgs, opt); err != nil {
						return fmt.Errorf("run: %w (use --raw to send the prompt as it is)", err)
					}
					// The template's own special tokens are parsed; the
					// prompt's are text.
					ids, err = chat.EncodePrompt(s.Tok, p, limit)
				}
				if err != nil {
					return fmt.Errorf("run: %w; the context holds %d tokens (-c sets it)", err, s.CtxSize())
				}
				if len(ids) == 0 {
					return errors.New("run: the prompt is empty")
				}
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
				defer stop()
				out := cmd.OutOrStdout()
				opt := session.GenerateOptions{Sampler: cfg, MaxTokens: nPredict, Stop: sf.stop, Special: special,
					OnText: func(t string) error {
						if printTokens {
							return nil
						}
						_, err := io.WriteString(out, t)
						return err
					}}
				if printTokens {
					opt.OnToken = func(id int) { fmt.Fprintf(out, "%d ", id) }
				}
				res, err := s.Generate(ctx, ids, opt)
				fmt.Fprintln(out)
				if res != nil {
					fmt.Fprintf(stderr, "\nprompt: %d tokens, %.1f t/s | generated: %d tokens, %.1f t/s | stop: %s | seed %d | %d threads\n",
						res.PromptTokens, res.PrefillRate(), len(res.Tokens), res.DecodeRate(), res.StopReason, res.Seed, s.Ctx.Threads())
				}
				if errors.Is(err, context.Canceled) {
					return interrupted
				}
				return err
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.StringVarP(&prompt, "prompt", "p", "", "prompt (default: read standard input)")
		f.StringVarP(&promptFile, "file", "f", "", "read the prompt from this file (- for standard input)")
		f.StringVarP(&system, "system", "s", "", "system prompt")
		f.BoolVar(&raw, "raw", false, "send the prompt as it is, without the chat template")
		f.BoolVar(&think, "think", true, "let reasoning models think (sets enable_thinking where the template has it)")
		f.BoolVar(&printTokens, "print-tokens", false, "print generated token ids instead of text")
		f.BoolVar(&special, "special", false, "print control tokens as text")
		f.IntVarP(&nPredict, "n-predict", "n", -1, "tokens to generate (-1: until the end of the turn or a full context)")
		f.IntVarP(&ctxSize, "ctx-size", "c", 0, "context size in tokens (0: the model's, at most 4096)")
		f.IntVarP(&thrds, "threads", "t", 0, "CPU threads (0: all cores)")
		pf.register(f)
		sf.register(f)
		return cmd
	})
}
