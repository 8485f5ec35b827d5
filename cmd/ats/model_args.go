package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/hub"
)

// The commands that run a model share habits, added here to every command
// with a --model flag rather than in each command's file:
//   - the model as the first argument (ats run model.gguf) as well as -m,
//     where the command takes no other arguments;
//   - a pulled model's name (ats run qwen3:8b) wherever a file goes;
//   - llama.cpp's -ngl / --n-gpu-layers, accepted with a note;
//   - -v to print the GPU report first (why the GPU is or is not used);
//   - value completion for the model, --backend and the other flags.

// positionalModel are the commands that take the model as an argument;
// the others with -m (tokenize) use their arguments for something else.
var positionalModel = map[string]bool{"run": true, "chat": true, "serve": true, "eval": true, "bench": true,
	"plan": true, "profile": true, "tokenize": true}

// pullsMissing are the commands that pull a hub model they are given and
// do not have (as ollama run and llama-server -hf do).
var pullsMissing = map[string]bool{"run": true, "chat": true, "serve": true}

// adaptModelCommands gives every model command under root the habits above.
func adaptModelCommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		registerCompletions(c)
		if c.Flags().Lookup("model") == nil {
			continue
		}
		addLlamaFlags(c)
		if positionalModel[c.Name()] {
			switch c.Name() {
			case "bench":
				c.Args = cobra.ArbitraryArgs // several models, as -m takes several
			case "tokenize":
				c.Args = cobra.MaximumNArgs(2) // MODEL TEXT
			default:
				c.Args = cobra.MaximumNArgs(1)
			}
			c.ValidArgsFunction = completeModelArg
		}
		f := c.Flags()
		if mf := f.Lookup("model"); positionalModel[c.Name()] {
			if _, many := mf.Value.(pflag.SliceValue); many {
				mf.Usage = "GGUF model files or pulled models' names (repeat or comma-separate; or give them as arguments)"
			} else {
				mf.Usage = "the model: a GGUF file or a pulled model's name (or give it as the first argument)"
			}
		} else {
			mf.Usage = "the model: a GGUF file or a pulled model's name"
		}
		if f.Lookup("backend") != nil {
			f.String("n-gpu-layers", "", "llama.cpp's GPU layer count (-ngl), accepted for habit: ats places each tensor by measurement within --vram-budget; 0 means --backend cpu")
		}
		if f.Lookup("verbose") == nil && f.Lookup("backend") != nil {
			f.BoolP("verbose", "v", false, "print the GPU report first: whether and why the GPU is used (as ats gpu does)")
		}
		prev := c.PreRunE
		c.PreRunE = func(cmd *cobra.Command, args []string) error {
			if err := takeModelArgs(cmd, args); err != nil {
				return err
			}
			if err := applyGPULayers(cmd); err != nil {
				return err
			}
			if err := applyLlamaFlags(cmd); err != nil {
				return err
			}
			if v, _ := cmd.Flags().GetBool("verbose"); v && cmd.Flags().Lookup("backend") != nil {
				if err := cuda.Report(cmd.ErrOrStderr()); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "ats: GPU report:", err)
				}
			}
			if prev != nil {
				return prev(cmd, args)
			}
			return nil
		}
	}
}

// takeModelArgs moves a positional model into --model and resolves every
// model given to a file.
func takeModelArgs(cmd *cobra.Command, args []string) error {
	f := cmd.Flags().Lookup("model")
	if !positionalModel[cmd.Name()] {
		args = nil
	}
	if cmd.Name() == "tokenize" {
		// ats tokenize MODEL [TEXT]: the model first when -m is not given
		// (tokenize -m MODEL TEXT reads its text argument itself).
		if f.Changed {
			args = nil
		} else if len(args) > 0 {
			args = args[:1]
		}
	}
	if hf := cmd.Flags().Lookup("hf-repo"); hf != nil && hf.Changed {
		if f.Changed || len(args) > 0 {
			return fmt.Errorf("%s: the model is given twice: -hf %s and %s", cmd.Name(), hf.Value.String(), strings.Join(append(args, f.Value.String()), " "))
		}
		args = []string{hf.Value.String()}
	}
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		vals := append(sv.GetSlice(), args...)
		if serve := cmd.Flags().Lookup("serve"); len(vals) == 0 && serve != nil && serve.Changed {
			return nil // bench --serve measures a server's model
		}
		if len(vals) == 0 {
			return fmt.Errorf("%s: no model given: ats %s MODEL... or -m MODEL (a .gguf file, or a pulled model's name: ats list)", cmd.Name(), cmd.Name())
		}
		for i, v := range vals {
			p, err := resolveModel(v)
			if err != nil {
				return fmt.Errorf("%s: %w", cmd.Name(), err)
			}
			vals[i] = p
		}
		return sv.Replace(vals)
	}
	val := f.Value.String()
	if len(args) == 1 {
		if f.Changed && val != args[0] {
			return fmt.Errorf("%s: the model is given twice: -m %s and %s", cmd.Name(), val, args[0])
		}
		val = args[0]
	}
	if val == "" && positionalModel[cmd.Name()] {
		return fmt.Errorf("%s: no model given: ats %s MODEL or -m MODEL (a .gguf file, or a pulled model's name: ats list)", cmd.Name(), cmd.Name())
	}
	p, err := resolveModel(val)
	var nf *missingModelError
	if errors.As(err, &nf) && pullsMissing[cmd.Name()] && nf.ref != nil {
		p, err = pullMissing(cmd, *nf.ref)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cmd.Name(), err)
	}
	return f.Value.Set(p)
}

// missingModelError is a model name that names no file and no pulled
// model; ref is set when it is a hub or URL reference that could be
// pulled.
type missingModelError struct {
	msg string
	ref *hub.Ref
}

func (e *missingModelError) Error() string { return e.msg }

// pullMissing pulls ref (with the progress pull shows) and returns its
// file.
func pullMissing(cmd *cobra.Command, ref hub.Ref) (string, error) {
	st, err := hub.OpenStore()
	if err != nil {
		return "", err
	}
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "ats: %s is not pulled yet: pulling it into %s\n", ref, st.Dir)
	ctx, stop := signal.NotifyContext(commandContext(cmd), os.Interrupt)
	defer stop()
	res, err := st.Pull(ctx, hub.NewClient(), ref, hub.PullOptions{Progress: newPullProgress(stderr)})
	if err != nil {
		var ue *hub.UnreachableError
		if errors.As(err, &ue) {
			return "", fmt.Errorf("pulling %s: %w (no network? HF_ENDPOINT names a mirror of the hub)", ref, err)
		}
		return "", fmt.Errorf("pulling %s: %w", ref, err)
	}
	return res.Manifest.Path(), nil
}

// resolveModel turns what was given as a model into a file: an existing
// file as it is, else the name of a pulled model. Something that looks
// like a path (a .gguf name, an absolute or ./ path) stays as it is, so
// opening it says the file is missing.
func resolveModel(arg string) (string, error) {
	if arg == "" {
		return "", nil
	}
	if _, err := os.Stat(arg); err == nil || looksLikePath(arg) {
		return arg, nil
	}
	st, err := hub.OpenStore()
	if err != nil {
		return "", err
	}
	m, err := st.Find(arg)
	ref, perr := hub.ParseRef(arg)
	var nf *hub.NotFoundError
	if errors.As(err, &nf) && perr == nil && ref.URL == "" {
		// ORG/REPO[:QUANT] is hf.co/ORG/REPO[:QUANT].
		m, err = st.Find(ref.String())
	}
	if err == nil {
		return m.Path(), nil
	}
	if !errors.As(err, &nf) {
		return "", err
	}
	e := &missingModelError{}
	hint := "ats list shows the pulled models"
	if perr == nil {
		e.ref = &ref
		if ref.URL == "" {
			hint = "ats pull " + arg + " downloads it"
		}
	}
	e.msg = fmt.Sprintf("%s: no such file, and no pulled model of that name in %s (%s)", arg, st.Dir, hint)
	return "", e
}

func looksLikePath(s string) bool {
	return strings.HasSuffix(strings.ToLower(s), ".gguf") || filepath.IsAbs(s) ||
		strings.HasPrefix(s, "."+string(filepath.Separator)) || strings.HasPrefix(s, "./") ||
		strings.HasPrefix(s, "..") || strings.HasPrefix(s, "~")
}

// applyGPULayers reads -ngl: 0 (every value 0, for bench's lists) means
// the CPU only, as --backend cpu; any other count gets a one-line note,
// since ats decides placement per tensor, not per layer.
func applyGPULayers(cmd *cobra.Command) error {
	f := cmd.Flags().Lookup("n-gpu-layers")
	if f == nil || !f.Changed {
		return nil
	}
	allZero := true
	for _, v := range strings.Split(f.Value.String(), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s: -ngl %q: want a number of layers", cmd.Name(), f.Value.String())
		}
		allZero = allZero && n == 0
	}
	stderr := cmd.ErrOrStderr()
	if !allZero {
		fmt.Fprintf(stderr, "ats: -ngl %s ignored: ats measures every tensor and keeps on the GPU those that gain most, within --vram-budget (--backend cpu for none)\n", f.Value.String())
		return nil
	}
	b := cmd.Flags().Lookup("backend")
	if b.Changed && b.Value.String() != executor.BackendCPU {
		return fmt.Errorf("%s: -ngl 0 means the CPU only, but --backend is %s", cmd.Name(), b.Value.String())
	}
	if err := b.Value.Set(executor.BackendCPU); err != nil {
		return err
	}
	b.Changed = true
	fmt.Fprintln(stderr, "ats: -ngl 0: running on the CPU only (--backend cpu)")
	return nil
}

// pulledNames are the names and aliases of the pulled models.
func pulledNames() []string {
	st, err := hub.OpenStore()
	if err != nil {
		return nil
	}
	ms, _ := st.List()
	var names []string
	for _, m := range ms {
		names = append(names, m.Names()...)
	}
	return names
}

// completeModelArg completes a model: pulled names and .gguf files.
func completeModelArg(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 && cmd.Name() != "bench" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return completeModel(cmd, args, toComplete)
}

// completeModel offers the pulled models whose name starts with what was
// typed and the .gguf files of the current directory that do; when none
// does, or what was typed is a path, the shell completes .gguf files.
func completeModel(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	files := []string{"gguf"}
	if looksLikePath(toComplete) || strings.ContainsRune(toComplete, filepath.Separator) && !strings.HasPrefix(strings.ToLower(toComplete), "hf") {
		return files, cobra.ShellCompDirectiveFilterFileExt
	}
	var out []string
	for _, n := range pulledNames() {
		if strings.HasPrefix(strings.ToLower(n), strings.ToLower(toComplete)) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return files, cobra.ShellCompDirectiveFilterFileExt
	}
	if ents, err := os.ReadDir("."); err == nil {
		for _, e := range ents {
			if n := e.Name(); !e.IsDir() && strings.HasSuffix(strings.ToLower(n), ".gguf") && strings.HasPrefix(n, toComplete) {
				out = append(out, n)
			}
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
