package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/tools/synth"
)

func init() {
	register(func() *cobra.Command {
		var (
			opt                  synth.Options
			out                  string
			list, verbose, force bool
		)
		cmd := &cobra.Command{
			Use:   "synth --preset NAME [--layout q4_k_m] [--routing random|balanced] [--pooling mean|cls|last] [--seed N] [--vocab FILE.gguf] -o OUT.gguf",
			Short: "Write a synthetic model: random weights in the exact shapes of a real one",
			Long: `synth writes a GGUF file with random weights in the exact shapes, tensor
names, types and metadata of a real model (Qwen3, Qwen3-MoE, GLM-4,
Llama 3.1), for tests and benchmarks where the real weights cannot be
downloaded. Speed does not depend on the weight values (MoE routing aside),
and llama.cpp loads these files too, so they stand in for the real ones.

Layouts: f32, f16, q8_0, and q4_k_m (Q4_K with Q6_K for the output and for
the attn_v / ffn_down tensors llama.cpp's Q4_K_M picks). The same seed gives
the same file. --vocab copies the tokenizer (and chat template) of a real
GGUF file instead of the made-up one. --list shows the presets. An
existing file is only replaced with --force.

--routing balanced (MoE presets) makes the routers spread a prompt over the
experts in every layer, as a trained router does. With the default,
random, a random model's tokens grow alike with depth and crowd onto a few
experts per layer, which flatters any runtime that computes or streams
only the experts a batch uses.

--pooling writes the pooling an embedding model's file names
(<arch>.pooling_type), which ats serve --embeddings and llama.cpp's
llama-embedding read; the tiny-qwen3-embed preset is an embedding model
already (last-token pooling, no BOS, EOS appended, as Qwen3-Embedding).`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if list {
					return listPresets(cmd.OutOrStdout())
				}
				if opt.Preset == "" || out == "" {
					return fmt.Errorf("synth: --preset and -o are required (--list shows the presets)")
				}
				// Check -o now rather than after minutes of building.
				if err := checkSynthOutput(out, opt, force); err != nil {
					return err
				}
				stderr := cmd.ErrOrStderr()
				opt.Progress = progressPrinter(stderr)
				st, err := synth.Write(out, opt)
				if err != nil {
					return err
				}
				for _, n := range st.Notes {
					fmt.Fprintln(stderr, "note:", n)
				}
				secs := st.Duration.Seconds()
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s, %.2f GiB, %d tensors, %.3gB parameters in %.1fs (%.0f MiB/s)\n",
					st.Path, opt.Preset, opt.Layout, float64(st.Bytes)/(1<<30), st.Tensors, float64(st.Params)/1e9,
					secs, float64(st.Bytes)/(1<<20)/max(secs, 1e-9))
				if verbose {
					if hwm := peakRSS(); hwm != "" {
						fmt.Fprintln(stderr, "peak resident memory (VmHWM):", hwm)
					}
				}
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVar(&opt.Preset, "preset", "", "model shape (see --list)")
		f.StringVar(&opt.Layout, "layout", "q4_k_m", "weight layout: "+strings.Join(synth.Layouts(), ", "))
		f.Uint64Var(&opt.Seed, "seed", 0, "random seed; the same seed writes the same file")
		f.StringVar(&opt.Vocab, "vocab", "", "copy the tokenizer metadata of this GGUF file (e.g. a vocab-only file)")
		f.IntVar(&opt.Layers, "layers", 0, "write only the first N blocks of the preset (0: all), to study a layer's speed on a small machine")
		f.StringVar(&opt.Pooling, "pooling", "", "embedding pooling to write as <arch>.pooling_type: "+strings.Join(synth.Poolings(), ", ")+" (default: the preset's)")
		f.StringVar(&opt.Routing, "routing", synth.RoutingRandom, "MoE routing: "+strings.Join(synth.Routings(), ", ")+" (balanced: spread over the experts in every layer, as a trained router)")
		f.IntVar(&opt.Threads, "threads", 0, "generator threads (0: all cores)")
		f.StringVarP(&out, "output", "o", "", "file to write")
		f.BoolVar(&list, "list", false, "list the presets with their parameter counts and sizes")
		f.BoolVarP(&verbose, "verbose", "v", false, "print the peak resident memory at the end")
		f.BoolVar(&force, "force", false, "replace the output file if it exists")
		return cmd
	})
}

// checkSynthOutput refuses an output that is a directory, an existing
// file without --force, or a place that cannot be written.
func checkSynthOutput(out string, opt synth.Options, force bool) error {
	st, err := os.Stat(out)
	switch {
	case err == nil && st.IsDir():
		return fmt.Errorf("synth: -o %s is a directory; give a file name, e.g. -o %s", out,
			filepath.Join(out, opt.Preset+"-"+opt.Layout+".gguf"))
	case err == nil && !force:
		return fmt.Errorf("synth: %s exists; --force replaces it", out)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("synth: -o: %w", err)
	}
	dir := filepath.Dir(out)
	probe, err := os.CreateTemp(dir, ".ats-synth-probe-*")
	if err != nil {
		return fmt.Errorf("synth: cannot write %s: %w", out, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	return nil
}

// listPresets prints every preset with its size in every layout.
func listPresets(out io.Writer) error {
	fmt.Fprintf(out, "%-16s %-9s %8s", "preset", "arch", "params")
	for _, l := range synth.Layouts() {
		fmt.Fprintf(out, " %11s", l+" GiB")
	}
	fmt.Fprintln(out, "  model")
	for _, p := range synth.Presets() {
		fmt.Fprintf(out, "%-16s %-9s %8s", p.Name, p.Arch, humanCount(p.Params()))
		for _, l := range synth.Layouts() {
			n, err := p.WeightBytes(l)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, " %11.3f", float64(n)/(1<<30))
		}
		fmt.Fprintf(out, "  %s\n", p.Description)
	}
	_, err := fmt.Fprintln(out, "(sizes are tensor data, as llama-bench reports them; the file adds a few MiB of metadata)")
	return err
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

// progressPrinter reports progress on w: a line redrawn in place on a
// terminal, otherwise a line every 10%.
func progressPrinter(w io.Writer) func(done, total int64) {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	start := time.Now()
	var last time.Time
	lastTenth := int64(-1)
	return func(done, total int64) {
		pct := float64(done) * 100 / float64(max(total, 1))
		rate := float64(done) / (1 << 20) / max(time.Since(start).Seconds(), 1e-9)
		line := fmt.Sprintf("synth: %.2f / %.2f GiB (%.0f%%), %.0f MiB/s", float64(done)/(1<<30), float64(total)/(1<<30), pct, rate)
		switch {
		case tty:
			if now := time.Now(); now.Sub(last) >= 200*time.Millisecond || done == total {
				last = now
				fmt.Fprintf(w, "\r%s\x1b[K", line)
				if done == total {
					fmt.Fprintln(w)
				}
			}
		case done*10/max(total, 1) > lastTenth:
			lastTenth = done * 10 / max(total, 1)
			fmt.Fprintln(w, line)
		}
	}
}

// peakRSS reads the process's peak resident set size from /proc (Linux);
// "" elsewhere.
func peakRSS() string { return procStatus("VmHWM:") }

// residentBytes is the process's resident set size now (VmRSS, Linux);
// 0 elsewhere.
func residentBytes() int64 {
	f := strings.Fields(procStatus("VmRSS:"))
	if len(f) != 2 || f[1] != "kB" {
		return 0
	}
	kb, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0
	}
	return kb << 10
}

// procStatus is the value of one line of /proc/self/status; "" where
// there is none.
func procStatus(key string) string {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), key); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
