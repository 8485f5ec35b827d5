package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/atsinfer/ats/runtime/text/sampler"
)

const chatHelp = `Commands:
  /set                 show the settings
  /set KEY VALUE       change one: temp, top_k, top_p, min_p, repeat_penalty,
                       repeat_last_n, presence_penalty, frequency_penalty,
                       seed (0: random), max_tokens (-1: no limit),
                       think (on, off, default), stop (a stop string; empty: none)
  /system [TEXT]       show or set the system prompt (/system none removes it)
  /clear               forget the conversation
  /stats               model, context use and the speed of the last answer
  /help                this text
  /exit                quit (also /quit, /bye, Ctrl-D)
Input: end a line with \ to continue it, or write text between """ lines.
Start a message with // to send a text that begins with /.`

// command runs a /command and reports whether to quit.
func (c *chatSession) command(line string) (quit bool) {
	name, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	arg = strings.TrimSpace(arg)
	switch name {
	case "/exit", "/quit", "/bye":
		return true
	case "/help", "/?":
		fmt.Fprintln(c.out, chatHelp)
	case "/clear":
		c.history = nil
		c.sess.Reset()
		fmt.Fprintln(c.out, "(conversation cleared)")
	case "/system":
		switch arg {
		case "":
			if c.system == "" {
				fmt.Fprintln(c.out, "(no system prompt)")
			} else {
				fmt.Fprintf(c.out, "system prompt: %s\n", c.system)
			}
		case "none":
			c.system = ""
			fmt.Fprintln(c.out, "(system prompt removed)")
		default:
			c.system = arg
			fmt.Fprintln(c.out, "(system prompt set)")
		}
	case "/set":
		if arg == "" {
			fmt.Fprintln(c.out, c.settings())
			return false
		}
		key, value, _ := strings.Cut(arg, " ")
		if err := c.set(key, strings.TrimSpace(value)); err != nil {
			fmt.Fprintf(c.out, "error: %v\n", err)
			return false
		}
		fmt.Fprintf(c.out, "(%s)\n", c.settings())
	case "/stats":
		fmt.Fprintln(c.out, c.stats())
	default:
		fmt.Fprintf(c.out, "unknown command %s; /help lists the commands\n", name)
	}
	return false
}

// set changes one setting; a sampling change that the sampler rejects
// leaves the old value.
func (c *chatSession) set(key, value string) error {
	key = strings.ReplaceAll(strings.ToLower(key), "-", "_")
	cfg := c.cfg
	f32 := func(dst *float32) error {
		v, err := strconv.ParseFloat(value, 32)
		if err != nil {
			return fmt.Errorf("%s: %q is not a number", key, value)
		}
		*dst = float32(v)
		return nil
	}
	integer := func(dst *int) error {
		v, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not an integer", key, value)
		}
		*dst = v
		return nil
	}
	var err error
	switch key {
	case "temp", "temperature":
		err = f32(&cfg.Temperature)
	case "top_k":
		err = integer(&cfg.TopK)
	case "top_p":
		err = f32(&cfg.TopP)
	case "min_p":
		err = f32(&cfg.MinP)
	case "repeat_penalty":
		err = f32(&cfg.RepeatPenalty)
	case "repeat_last_n":
		err = integer(&cfg.RepeatLastN)
	case "presence_penalty":
		err = f32(&cfg.PresencePenalty)
	case "frequency_penalty":
		err = f32(&cfg.FrequencyPenalty)
	case "seed":
		cfg.Seed, err = strconv.ParseUint(value, 10, 64)
		if err != nil {
			err = fmt.Errorf("seed: %q is not a non-negative integer", value)
		}
	case "max_tokens", "n_predict", "n":
		var n int
		if err = integer(&n); err == nil {
			c.maxTokens = max(n, 0)
		}
		return err
	case "think":
		switch strings.ToLower(value) {
		case "on", "true", "yes", "1":
			t := true
			c.think = &t
		case "off", "false", "no", "0":
			t := false
			c.think = &t
		case "default", "":
			c.think = nil
		default:
			return fmt.Errorf("think: use on, off or default")
		}
		return nil
	case "stop":
		c.stop = nil
		if v := strings.Trim(value, `"`); v != "" {
			c.stop = []string{v}
		}
		return nil
	case "system":
		c.system = value
		return nil
	default:
		return fmt.Errorf("no setting %q; /help lists them", key)
	}
	if err != nil {
		return err
	}
	if _, err := sampler.New(cfg, c.sess.Model.Hyper().NVocab); err != nil {
		return err
	}
	if err := checkRepeatWindow(cfg.RepeatLastN, c.sess.CtxSize()); err != nil {
		return err
	}
	c.cfg = cfg
	return nil
}

func (c *chatSession) settings() string {
	cfg := c.cfg
	seed := "random"
	if cfg.Seed != 0 {
		seed = strconv.FormatUint(cfg.Seed, 10)
	}
	maxTok := "no limit"
	if c.maxTokens > 0 {
		maxTok = strconv.Itoa(c.maxTokens)
	}
	think := "default"
	if c.think != nil {
		think = map[bool]string{true: "on", false: "off"}[*c.think]
	}
	s := fmt.Sprintf("temp %g, top_k %d, top_p %g, min_p %g, repeat_penalty %g, repeat_last_n %d, presence_penalty %g, frequency_penalty %g, seed %s, max_tokens %s, think %s",
		cfg.Temperature, cfg.TopK, cfg.TopP, cfg.MinP, cfg.RepeatPenalty, cfg.RepeatLastN, cfg.PresencePenalty, cfg.FrequencyPenalty, seed, maxTok, think)
	if len(c.stop) > 0 {
		s += fmt.Sprintf(", stop %q", c.stop)
	}
	return s
}

func (c *chatSession) stats() string {
	var b strings.Builder
	m := c.sess.Model
	tmpl := "the model's own"
	if c.sess.Template != nil && c.sess.Template.Family() != "" {
		tmpl = "built-in " + c.sess.Template.Family()
	}
	fmt.Fprintf(&b, "model:    %s (%s), %.1f MiB of weights on the CPU; chat template: %s\n",
		filepath.Base(c.modelPath), m, float64(m.WeightBytes())/(1<<20), tmpl)
	fmt.Fprintf(&b, "context:  %d of %d tokens in the KV cache; %s in the conversation; %d threads\n",
		c.sess.Cached(), c.sess.CtxSize(), plural(len(c.history)/2, "exchange", "exchanges"), c.sess.Ctx.Threads())
	if r := c.last; r != nil {
		fmt.Fprintf(&b, "last:     %d tokens at %.1f tokens/s, first after %s, %s in all (stop: %s)\n",
			len(r.Tokens), r.DecodeRate(), c.lastTTFT.Round(100_000), c.lastTime.Round(100_000), r.StopReason)
		fmt.Fprintf(&b, "          prompt %d tokens, %d of them cached, evaluated at %.0f tokens/s\n",
			r.PromptTokens, r.CachedTokens, r.PrefillRate())
	} else {
		b.WriteString("last:     no answer yet\n")
	}
	fmt.Fprintf(&b, "settings: %s", c.settings())
	return b.String()
}

// plural is "1 exchange", "2 exchanges", "0 exchanges".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
