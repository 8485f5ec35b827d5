package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// llama.cpp's flags as its users type them. pflag reads a single dash
// and several letters as a group of one-letter flags (-hf as -h -f, -np as
// -n p), so llamaSpellings rewrites the spellings of llamaFlags to their
// long names before parsing. A long name ats has (--n-gpu-layers,
// --hf-repo, ...) then just works; one it has not gets the error of
// flagError, which names the flag as it was typed and says what ats does
// instead (llamaHints).
//
// A flag that ats gains later needs no change here: adding its long name
// to a command makes the llama.cpp spelling work there.

// llamaFlag is one of llama.cpp's spellings.
type llamaFlag struct {
	spelling string // as typed: -hf
	long     string // the long flag it becomes: --hf-repo
	// values, when set, are the values the flag may take in the next
	// argument; without one of them it takes none (-fa, or -fa on).
	values []string
}

var llamaFlags = []llamaFlag{
	{spelling: "-ngl", long: "--n-gpu-layers"},
	{spelling: "--gpu-layers", long: "--n-gpu-layers"},
	{spelling: "-hf", long: "--hf-repo"},
	{spelling: "-hfr", long: "--hf-repo"},
	{spelling: "-fa", long: "--flash-attn", values: []string{"on", "off", "auto", "1", "0", "true", "false"}},
	{spelling: "--flash-attn", long: "--flash-attn", values: []string{"on", "off", "auto", "1", "0", "true", "false"}},
	{spelling: "-ub", long: "--ubatch-size"},
	{spelling: "-dev", long: "--device"},
	{spelling: "-np", long: "--parallel"},
	{spelling: "-ctk", long: "--cache-type-k"},
	{spelling: "-ctv", long: "--cache-type-v"},
	{spelling: "-cb", long: "--cont-batching"},
	{spelling: "-sm", long: "--split-mode"},
	{spelling: "-ts", long: "--tensor-split"},
	{spelling: "-mg", long: "--main-gpu"},
	{spelling: "-ot", long: "--override-tensor"},
	{spelling: "-ncmoe", long: "--n-cpu-moe"},
	{spelling: "-cmoe", long: "--cpu-moe"},
	{spelling: "-nkvo", long: "--no-kv-offload"},
	{spelling: "-mmp", long: "--mmap"},
	{spelling: "-fit", long: "--fit"},
	{spelling: "-cnv", long: "--conversation"},
	{spelling: "-sys", long: "--system"},
	{spelling: "-hff", long: "--hf-file"},
	{spelling: "-to", long: "--timeout"},
}

// llamaHints say what ats does instead of a llama.cpp flag it does not
// have, by the flag's long name.
var llamaHints = map[string]string{
	"--parallel":        "only ats serve runs several requests at once (ats serve --parallel N)",
	"--cont-batching":   "only ats serve batches requests, always (--parallel)",
	"--split-mode":      "ats places every tensor by measurement: see --vram-budget and ats plan",
	"--tensor-split":    "ats uses one GPU and places every tensor by measurement: see --vram-budget",
	"--main-gpu":        "ats uses the first GPU",
	"--override-tensor": "ats places every tensor by measurement; --placement FILE takes a placement edited by hand (ats plan --json)",
	"--n-cpu-moe":       "ats places the experts by measurement within --vram-budget (ats plan shows where)",
	"--cpu-moe":         "ats places the experts by measurement within --vram-budget (ats plan shows where)",
	"--no-kv-offload":   "the KV cache lives with its layer's attention, where the plan puts it",
	"--mmap":            "ats always maps the model file",
	"--fit":             "ats always fits the model to the memory it has: see --vram-budget",
	"--conversation":    "ats chat MODEL is the conversation mode",
	"--hf-file":         "name the quantization instead: -hf ORG/REPO:QUANT",
	"--timeout":         "ats serve cuts slow clients off by itself",
	"--ctx-size":        "this command takes no context size",
	"--gpu":             "only ats plan takes --gpu (a card's name, to plan for it without one)",
	"--embeddings":      "only ats serve takes --embeddings",
	"--n-predict":       "this command generates nothing: see ats run -n",
	"--batch-size":      "ats sizes its prompt batches itself",
}

// llamaSpellings rewrites llama.cpp's spellings (llamaFlags) to their long
// names. Arguments after "--" stay.
func llamaSpellings(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, value, hasValue := strings.Cut(a, "=")
		k := slices.IndexFunc(llamaFlags, func(f llamaFlag) bool { return f.spelling == name })
		if k < 0 {
			out = append(out, a)
			continue
		}
		f := llamaFlags[k]
		switch {
		case hasValue:
			out = append(out, f.long+"="+value)
		case f.values != nil:
			// An optional value: take the next argument only when it is one.
			v := "on"
			if i+1 < len(args) && slices.Contains(f.values, args[i+1]) {
				v = args[i+1]
				i++
			}
			out = append(out, f.long+"="+v)
		default:
			out = append(out, f.long)
		}
	}
	return out
}

// flagError explains a flag pflag refused: llama.cpp's and ollama's
// habits get what ats does instead, any other unknown flag the command's
// help.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	name, found := strings.CutPrefix(msg, "unknown flag: ")
	if !found {
		if sh, ok := strings.CutPrefix(msg, "unknown shorthand flag: "); ok {
			return fmt.Errorf("%s: unknown flag %s; see ats %s --help", cmd.Name(), sh, cmd.Name())
		}
		return fmt.Errorf("%s: %w", cmd.Name(), err)
	}
	typed := name
	for _, f := range llamaFlags {
		if f.long == name && f.spelling != name {
			typed = f.spelling + " (" + name + ")"
			break
		}
	}
	if hint, ok := llamaHints[name]; ok {
		return fmt.Errorf("%s: unknown flag %s: %s", cmd.Name(), typed, hint)
	}
	return fmt.Errorf("%s: unknown flag %s; see ats %s --help", cmd.Name(), typed, cmd.Name())
}

// addLlamaFlags gives a model command the llama.cpp flags that ats takes
// for habit's sake (their meaning in ats is in the usage), hidden from
// its help but for --hf-repo.
func addLlamaFlags(c *cobra.Command) {
	f := c.Flags()
	if f.Lookup("backend") == nil {
		return
	}
	hide := func(name string) { f.MarkHidden(name) }
	f.String("flash-attn", "", "llama.cpp's -fa, accepted for habit: ats's attention kernels are always fused")
	f.Lookup("flash-attn").NoOptDefVal = "on"
	hide("flash-attn")
	f.Int("ubatch-size", 0, "llama.cpp's -ub, accepted for habit: ats sizes its batches itself")
	hide("ubatch-size")
	f.Bool("jinja", true, "llama.cpp's --jinja, accepted for habit: ats renders every chat template with Jinja")
	hide("jinja")
	f.String("device", "", "llama.cpp's -dev: `DEV` none (the CPU only, as --backend cpu) or CUDA0 (the GPU)")
	if positionalModel[c.Name()] && c.Name() != "bench" && c.Name() != "eval" {
		f.String("hf-repo", "", "llama.cpp's -hf: `ORG/REPO[:QUANT]` on Hugging Face, pulled first if missing (as ats pull)")
	}
}

// applyLlamaFlags reads the llama.cpp flags: -dev picks the backend, and
// -hf names the model (done in takeModelArgs).
func applyLlamaFlags(cmd *cobra.Command) error {
	f := cmd.Flags().Lookup("device")
	if f == nil || !f.Changed {
		return nil
	}
	var backend string
	switch d := strings.ToLower(f.Value.String()); {
	case d == "none" || d == "cpu":
		backend = executor.BackendCPU
	case d == "cuda0" || d == "cuda":
		backend = executor.BackendGPU
	default:
		return fmt.Errorf("%s: -dev %s: ats runs on none (the CPU) or CUDA0 (the first GPU)", cmd.Name(), f.Value.String())
	}
	b := cmd.Flags().Lookup("backend")
	if b.Changed && b.Value.String() != backend {
		return fmt.Errorf("%s: -dev %s means --backend %s, but --backend is %s", cmd.Name(), f.Value.String(), backend, b.Value.String())
	}
	b.Changed = true
	return b.Value.Set(backend)
}

// placeholders names the values of flags whose usage names none, in the
// help: --model MODEL, not --model string.
var placeholders = map[string]string{
	"model": "MODEL", "vram-budget": "SIZE", "placement": "FILE", "trace": "FILE", "backend": "BACKEND",
	"plan-for": "GOAL", "host": "ADDR", "port": "PORT", "alias": "NAME", "api-key": "KEY", "cors": "ORIGINS",
	"prompt": "TEXT", "file": "FILE", "system": "TEXT", "svg": "FILE", "stop": "TEXT", "logit-bias": "TOKEN±BIAS",
	"ctx-size": "N", "threads": "N", "n-predict": "N", "queue": "N", "batch-size": "N", "n-gpu-layers": "N",
	"gpu": "NAME", "gpu-vram": "SIZE", "link-gbps": "GB/s", "pooling": "POOLING", "history": "FILE",
	"seed": "N", "top-k": "K", "temp": "T", "top-p": "P", "min-p": "P", "repeat-penalty": "X", "repeat-last-n": "N",
	"presence-penalty": "X", "frequency-penalty": "X", "shutdown-grace": "DURATION", "name": "NAME", "sha256": "HEX",
	"output": "FILE", "preset": "PRESET", "layout": "LAYOUT", "tokens": "IDS", "logits-json": "FILE", "cache-type-k": "TYPE", "cache-type-v": "TYPE",
}

// setPlaceholders gives every non-boolean flag under c a placeholder in
// its help, and refuses (in tests) a usage whose backquotes would make a
// command the placeholder.
func setPlaceholders(c *cobra.Command) {
	c.Flags().VisitAll(func(f *pflag.Flag) {
		// Numbers show their type (int, float32), a value placeholder
		// already; a string's type says nothing.
		if f.Value.Type() != "string" || strings.Contains(f.Usage, "`") {
			return
		}
		if p, ok := placeholders[f.Name]; ok {
			f.Usage = "`" + p + "`: " + f.Usage
		}
	})
	for _, sub := range c.Commands() {
		setPlaceholders(sub)
	}
}
