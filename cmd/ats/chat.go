package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime/server"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

func init() {
	register(func() *cobra.Command {
		var (
			modelPath, system, history string
			nPredict, ctxSize, thrds   int
			pf                         placementFlags
			think                      bool
			sf                         samplingFlags
		)
		cmd := &cobra.Command{
			Use:   "chat MODEL",
			Short: "Talk with a model in the terminal",
			Long: `chat is an interactive conversation with the model: type a message and the
answer streams back, with its speed after it. The conversation is kept, and
since the KV cache holds it, each turn only evaluates what is new.

Editing: arrow keys, history (saved in --history), Ctrl-R to search it.
Multi-line input: end a line with \ to go on, or put the text between """
lines. Ctrl-C stops an answer; at an empty prompt, Ctrl-C or Ctrl-D quits.

Commands: /help, /set KEY VALUE (temp, top_k, top_p, min_p, seed,
max_tokens, think, ...), /system TEXT, /clear, /stats, /exit.

With standard input from a pipe or a file, chat reads turns from it (the
same syntax, commands too), prints the answers and exits at the end.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return errors.New("chat: -m MODEL is required")
				}
				cfg, err := sf.config()
				if err != nil {
					return err
				}
				stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
				stdin := cmd.InOrStdin()
				interactive := stdin == io.Reader(os.Stdin) && isTerminal(os.Stdin) && isTerminal(stdout)
				warn := func(s string) { fmt.Fprintln(stderr, "ats: warning:", s) }
				copt := session.Options{CtxSize: ctxSize, Threads: thrds}
				if err := pf.apply(&copt, stderr); err != nil {
					return err
				}
				sess, err := loadSession(modelPath, copt, stderr, warn)
				if err != nil {
					return err
				}
				defer sess.Model.Close()
				defer sess.Close()
				// Load the template now, so its warnings come before the
				// first prompt rather than inside the first answer.
				if _, err := sess.RenderChat([]chat.Message{{Role: "user", Content: "hi"}}, chat.Options{AddGenerationPrompt: true}); err != nil {
					return fmt.Errorf("chat: %w", err)
				}
				c := &chatSession{
					sess: sess, out: stdout, info: stderr, system: system, cfg: cfg, stop: sf.stop,
					maxTokens: max(nPredict, 0),
					color:     interactive && os.Getenv("NO_COLOR") == "",
					terminal:  interactive,
					format:    server.DetectToolFormat(sess.Template.Source()),
					modelPath: modelPath,
				}
				if _, err := sampler.New(cfg, sess.Model.Hyper().NVocab); err != nil {
					return fmt.Errorf("chat: %w", err)
				}
				if err := checkRepeatWindow(cfg.RepeatLastN, sess.CtxSize()); err != nil {
					return fmt.Errorf("chat: --repeat-last-n: %w", err)
				}
				if cmd.Flags().Changed("think") {
					c.think = &think
				}

				var src lineSource
				if interactive {
					ts, err := newTermSource(history)
					if err != nil {
						return fmt.Errorf("chat: %w", err)
					}
					src = ts
					fmt.Fprintf(stdout, "Chatting with %s. /help lists the commands; Ctrl-D or /exit quits.\n", filepath.Base(modelPath))
				} else {
					src = &pipeSource{r: bufio.NewReader(stdin)}
				}
				defer src.close()
				tr := &turnReader{src: src, prompt: ">>> ", second: "... "}

				// Ctrl-C while an answer streams stops that answer. At the
				// prompt the terminal is in raw mode and readline sees
				// Ctrl-C as a key; a signal then only comes from a pipe
				// run, and ends it.
				sigc := make(chan os.Signal, 1)
				signal.Notify(sigc, os.Interrupt)
				defer func() {
					signal.Stop(sigc)
					close(sigc)
				}()
				go func() {
					for range sigc {
						if !c.interrupt() {
							fmt.Fprintln(stderr)
							os.Exit(130)
						}
					}
				}()

				for {
					turn, err := tr.readTurn()
					if errors.Is(err, errInterrupted) {
						continue
					}
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						return fmt.Errorf("chat: reading input: %w", err)
					}
					if strings.TrimSpace(turn) == "" {
						continue
					}
					if strings.HasPrefix(turn, "/") && !strings.HasPrefix(turn, "//") {
						if c.command(turn) {
							break
						}
						continue
					}
					// "//" sends a message that starts with a slash.
					if strings.HasPrefix(turn, "//") {
						turn = turn[1:]
					}
					if err := c.answer(cmd.Context(), turn); err != nil {
						return err
					}
				}
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.StringVarP(&system, "system", "s", "", "system prompt")
		f.IntVarP(&nPredict, "n-predict", "n", -1, "most tokens per answer (-1: until the end of the turn)")
		f.IntVarP(&ctxSize, "ctx-size", "c", 0, "context size in tokens (0: the model's, at most 4096)")
		f.IntVarP(&thrds, "threads", "t", 0, "CPU threads (0: all cores)")
		pf.register(f)
		f.BoolVar(&think, "think", true, "let reasoning models think (sets enable_thinking where the template has it)")
		f.StringVar(&history, "history", defaultHistoryFile(), "file that keeps the input history (\"\": none)")
		sf.register(f)
		return cmd
	})
}

// defaultHistoryFile is ~/.ats_history.
func defaultHistoryFile() string {
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".ats_history")
}

// chatSession is one conversation and its settings.
type chatSession struct {
	sess      *session.Session
	modelPath string
	out, info io.Writer // answers; notes and speeds
	color     bool      // dim the reasoning and the notes
	terminal  bool      // stdout is a terminal
	format    server.ToolFormat

	system    string
	history   []chat.Message // user and assistant turns, in pairs
	cfg       sampler.Config
	maxTokens int // 0: until the end of the turn
	stop      []string
	think     *bool // nil: the template's default

	mu     sync.Mutex
	cancel context.CancelFunc // of the answer being generated

	last     *session.GenerateResult
	lastTTFT time.Duration
	lastTime time.Duration
}

// interrupt stops the answer being generated, reporting whether there was
// one.
func (c *chatSession) interrupt() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel == nil {
		return false
	}
	c.cancel()
	return true
}

// messagesWith is the conversation of history and a new user message.
func (c *chatSession) messagesWith(history []chat.Message, user string) []chat.Message {
	var msgs []chat.Message
	if c.system != "" {
		msgs = append(msgs, chat.Message{Role: "system", Content: c.system})
	}
	msgs = append(msgs, history...)
	return append(msgs, chat.Message{Role: "user", Content: user})
}

func (c *chatSession) vars() map[string]any {
	if c.think == nil {
		return nil
	}
	return map[string]any{"enable_thinking": *c.think}
}

// note prints a remark on the info stream, dimmed on a terminal.
func (c *chatSession) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if c.color {
		msg = "\x1b[2m" + msg + "\x1b[0m"
	}
	fmt.Fprintln(c.info, msg)
}

// answer sends a user message and streams the reply.
func (c *chatSession) answer(parent context.Context, user string) error {
	ctxSize := c.sess.CtxSize()
	// Room to leave for the answer when deciding whether the conversation
	// still fits: the answer's limit, or an eighth of the context.
	reserve := c.maxTokens
	if reserve <= 0 {
		reserve = ctxSize / 8
	}
	var prompt string
	var ids []int
	// Older exchanges are dropped from a copy: if the message is too long
	// even alone, the conversation stays as it was.
	history, dropped := c.history, 0
	tooLong := false
	for {
		p, err := c.sess.RenderPrompt(c.messagesWith(history, user), chat.Options{AddGenerationPrompt: true, Vars: c.vars()})
		if err != nil {
			c.note("error: %v", err)
			return nil
		}
		prompt = p.Text
		// The template's special tokens are parsed, the messages' are
		// text; a prompt past the context stops being tokenized there.
		ids, err = chat.EncodePrompt(c.sess.Tok, p, ctxSize-1)
		tooLong = err != nil
		if !tooLong && len(ids)+reserve <= ctxSize || len(history) < 2 {
			break
		}
		history = history[2:]
		dropped++
	}
	if tooLong {
		c.note("this message is too long for the context of %d tokens (start ats chat with a larger --ctx-size); the conversation is kept", ctxSize)
		return nil
	}
	if dropped > 0 {
		c.history = history
		what := "the oldest exchange"
		if dropped > 1 {
			what = fmt.Sprintf("the %d oldest exchanges", dropped)
		}
		c.note("(the conversation outgrew the context of %d tokens: forgot %s)", ctxSize, what)
	}

	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	c.mu.Lock()
	c.cancel = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.cancel = nil
		c.mu.Unlock()
	}()

	parser := server.NewStreamParser(server.ParseOptions{Format: c.format, ThinkingOpen: server.ThinkingOpen(prompt)})
	d := &display{w: c.out, color: c.color, terminal: c.terminal}
	start := time.Now()
	var first time.Duration
	res, err := c.sess.Generate(ctx, ids, session.GenerateOptions{
		Sampler:   c.cfg,
		MaxTokens: c.maxTokens,
		Stop:      c.stop,
		OnToken: func(int) {
			if first == 0 {
				first = time.Since(start)
			}
		},
		OnText: func(s string) error { return d.show(parser.Push(s)) },
	})
	d.show(parser.Finish())
	d.end()
	stopped := errors.Is(err, context.Canceled)
	if err != nil && !stopped {
		c.note("error: %v", err)
		return nil
	}
	reply := parser.Result()
	c.history = append(c.history,
		chat.Message{Role: "user", Content: user},
		chat.Message{Role: "assistant", Content: reply.Content, ReasoningContent: reply.Reasoning})
	c.last, c.lastTTFT, c.lastTime = res, first, time.Since(start)
	if res != nil {
		why := ""
		switch {
		case stopped:
			why = " · stopped"
		case res.StopReason == session.StopLength && res.ContextTokens >= ctxSize:
			why = " · the context is full: /clear to start over"
		case res.StopReason == session.StopLength:
			why = " · max_tokens reached"
		}
		c.note("[%d tokens, %.1f tokens/s · prompt %d tokens (%d cached), %.0f tokens/s%s]",
			len(res.Tokens), res.DecodeRate(), res.PromptTokens, res.CachedTokens, res.PrefillRate(), why)
	}
	return nil
}

// display prints a streamed reply: reasoning dimmed (or marked, without a
// terminal), then the answer.
type display struct {
	w        io.Writer
	color    bool
	terminal bool
	thinking bool
	lastByte byte
	err      error
}

// text writes model output; on a terminal its control characters are
// made visible.
func (d *display) text(s string) {
	if d.terminal {
		s = visibleControls(s)
	}
	d.write(s)
}

func (d *display) write(s string) {
	if s == "" || d.err != nil {
		return
	}
	_, d.err = io.WriteString(d.w, s)
	d.lastByte = s[len(s)-1]
}

// visibleControls spells out control characters other than newline, tab
// and carriage return, so a model's output cannot drive the terminal (an
// escape sequence could move the cursor, retitle the window, ...).
func visibleControls(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			if r == 0x7f {
				b.WriteString("^?")
			} else {
				b.WriteByte('^')
				b.WriteByte(byte(r) + '@')
			}
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' && r != '\r' || r == 0x7f }

func (d *display) show(x server.Delta) error {
	if x.Reasoning != "" {
		if !d.thinking {
			d.thinking = true
			if d.color {
				d.write("\x1b[2m")
			} else {
				d.write("Thinking...\n")
			}
		}
		d.text(x.Reasoning)
	}
	if x.Content != "" {
		d.endThinking()
		d.text(x.Content)
	}
	return d.err
}

func (d *display) endThinking() {
	if !d.thinking {
		return
	}
	d.thinking = false
	if d.color {
		d.write("\x1b[0m\n\n")
	} else {
		d.write("\n...done thinking.\n\n")
	}
}

func (d *display) end() {
	d.endThinking()
	if d.lastByte != '\n' {
		d.write("\n")
	}
}
