package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/hub"
)

// The commands for models by name: pull, list, rm, show. The logic is in
// runtime/hub; these print.

func init() {
	register(newPullCmd)
	register(newListCmd)
	register(newRmCmd)
	register(newShowCmd)
}

func newPullCmd() *cobra.Command {
	var opt hub.PullOptions
	cmd := &cobra.Command{
		Use:   "pull [hf.co/]ORG/REPO[:QUANT] | URL | FILE.gguf",
		Short: "Download a model from Hugging Face or a URL into the models directory",
		Long: `pull downloads a GGUF model into the models directory ($ATS_MODELS, by
default ~/.local/share/ats/models or the system's equivalent), where every
command finds it by name: ats run hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M.

From the hub, QUANT picks the file of that quantization (Q4_K_M, Q8_0,
IQ4_XS, ...; case does not matter; Q4_K_M when not given and the repository
has several); a split model (NAME-00001-of-0000N.gguf) comes with all its
parts. A URL names a .gguf file (the first part of a split one).

Downloads resume where they stopped (run pull again after an interruption),
are checked against the sha256 the hub publishes, and are put in place only
when complete and verified. A hub model also answers to a short name
(qwen3-8b:q4_k_m); --alias adds more (qwen3:8b).

A local FILE.gguf is registered under a name (the file's, in lower case,
without .gguf; or --name) without copying it: the models directory gets a
link to it, and its QUANT is read from the file.

HF_TOKEN is sent to the hub for gated and private repositories; HF_ENDPOINT
names a mirror of the hub.`,
		Example: `  ats pull hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M --alias qwen3:8b
  ats run qwen3:8b -p "Why is the sky blue?"
  ats pull https://example.com/models/my-model-q8_0.gguf --sha256 3f5a...`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(args[0]); err == nil || looksLikePath(args[0]) && !strings.Contains(args[0], "://") {
				return importLocal(cmd, args[0], opt)
			}
			ref, err := hub.ParseRef(args[0])
			if err != nil {
				return fmt.Errorf("pull: %w", err)
			}
			st, err := hub.OpenStore()
			if err != nil {
				return fmt.Errorf("pull: %w", err)
			}
			stderr := cmd.ErrOrStderr()
			opt.Progress = newPullProgress(stderr)
			ctx, stop := signal.NotifyContext(commandContext(cmd), os.Interrupt)
			defer stop()
			res, err := st.Pull(ctx, hub.NewClient(), ref, opt)
			if err != nil {
				var ue *hub.UnreachableError
				if errors.As(err, &ue) {
					return fmt.Errorf("pull: %w\n(no network? pull needs to reach %s; HF_ENDPOINT names a mirror of the hub)", err, ue.Host)
				}
				return fmt.Errorf("pull: %w", err)
			}
			m := res.Manifest
			out := cmd.OutOrStdout()
			if len(res.Fetched) == 0 {
				fmt.Fprintf(out, "%s is up to date (%s in %s)\n", m.Name, sizeStr(m.Size()), m.Dir())
			} else {
				fmt.Fprintf(out, "pulled %s: %s in %d file(s) into %s\n", m.Name, sizeStr(m.Size()), len(m.Files), m.Dir())
			}
			if len(m.Aliases) > 0 {
				fmt.Fprintf(out, "also called: %s\n", strings.Join(m.Aliases, ", "))
			}
			short := m.Name
			if len(m.Aliases) > 0 {
				short = m.Aliases[0]
			}
			fmt.Fprintf(out, "run it: ats run %s\n", short)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opt.Name, "name", "", "the model's name (default hf.co/ORG/REPO:QUANT, or the file's name for a URL)")
	f.StringArrayVar(&opt.Aliases, "alias", nil, "another name for the model, e.g. qwen3:8b (repeatable)")
	f.StringVar(&opt.SHA256, "sha256", "", "expected sha256 of a URL's file, where its source publishes one")
	return cmd
}

// commandContext is the command's context, or a background one when it
// runs outside Execute (tests call RunE directly).
func commandContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// pullProgress shows a pull: a progress bar per file on a terminal, a
// line per file and per 10% otherwise.
type pullProgress struct {
	w         io.Writer
	tty       bool
	bar       *progressbar.ProgressBar
	name      string
	size      int64
	done      int64
	lastTenth int64
}

func newPullProgress(w io.Writer) *pullProgress {
	return &pullProgress{w: w, tty: isTerminal(w)}
}

func (p *pullProgress) Start(name string, size, have int64) {
	p.name, p.size, p.done, p.lastTenth = name, size, have, -1
	if p.tty {
		p.bar = progressbar.NewOptions64(size,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription("pulling "+name),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetRenderBlankState(true),
		)
		if have > 0 {
			p.bar.Set64(have)
		}
		return
	}
	line := fmt.Sprintf("pulling %s (%s)", name, sizeStr(size))
	if have > 0 {
		line += fmt.Sprintf(", resuming at %s", sizeStr(have))
	}
	fmt.Fprintln(p.w, line)
}

func (p *pullProgress) Add(n int64) {
	p.done += n
	if p.bar != nil {
		p.bar.Add64(n)
		return
	}
	if p.size > 0 {
		if tenth := p.done * 10 / p.size; tenth > p.lastTenth && tenth < 10 {
			p.lastTenth = tenth
			fmt.Fprintf(p.w, "  %s: %s of %s (%d%%)\n", p.name, sizeStr(p.done), sizeStr(p.size), tenth*10)
		}
	}
}

// Waiting: another pull of the same model holds its folder; this one
// continues when that one ends.
func (p *pullProgress) Waiting(name string) {
	fmt.Fprintf(p.w, "ats: pull: another pull of %s is running; waiting for it to finish\n", name)
}

// Verifying: the file is read back from the disk for its sha256.
func (p *pullProgress) Verifying(name string, size int64) {
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
	fmt.Fprintf(p.w, "%s: checking the sha256 of the %s on disk\n", name, sizeStr(size))
}

func (p *pullProgress) Retry(err error, wait time.Duration) {
	if p.bar != nil {
		p.bar.Clear()
	}
	when := "resuming"
	if wait > 0 {
		when = "trying again in " + wait.Round(time.Millisecond).String()
	}
	fmt.Fprintf(p.w, "ats: pull: %v; %s\n", err, when)
}

func (p *pullProgress) Done(f hub.File) {
	if p.bar != nil {
		p.bar.Finish()
		p.bar = nil
	}
	check := "sha256 verified"
	if !f.Verified {
		check = "no checksum published; sha256 " + f.SHA256[:12] + "..."
	}
	fmt.Fprintf(p.w, "%s: %s, %s\n", f.Name, sizeStr(f.Size), check)
}

// sizeStr is a size for people: 4.68 GiB, 310.2 MiB, 512 B; "?" unknown.
func sizeStr(n int64) string {
	switch {
	case n < 0:
		return "size unknown"
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// completePulled completes the names of pulled models.
func completePulled(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	var out []string
	for _, n := range pulledNames() {
		if strings.HasPrefix(strings.ToLower(n), strings.ToLower(toComplete)) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// listedModel is a model as ats list --json prints it.
type listedModel struct {
	*hub.Manifest
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
}

func newListCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the pulled models",
		Long: `list shows the models in the models directory ($ATS_MODELS): each one's name,
quantization, size, when it was pulled and its other names. Any of the
names works wherever a model file does (ats run NAME, -m NAME).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := hub.OpenStore()
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			ms, errs := st.List()
			out, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			for _, e := range errs {
				fmt.Fprintln(stderr, "ats: warning:", e)
			}
			if asJSON {
				list := []listedModel{}
				for _, m := range ms {
					list = append(list, listedModel{Manifest: m, Path: m.Path(), SizeBytes: m.Size()})
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			if len(ms) == 0 {
				fmt.Fprintf(out, "no models in %s yet: ats pull hf.co/ORG/REPO:QUANT downloads one\n", st.Dir)
			} else {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tQUANT\tSIZE\tPULLED\tALSO CALLED")
				for _, m := range ms {
					q := m.Quant
					if q == "" {
						q = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, q, sizeStr(m.Size()), m.Pulled.Local().Format("2006-01-02 15:04"), strings.Join(m.Aliases, ", "))
				}
				tw.Flush()
			}
			if us, _ := st.Unfinished(); len(us) > 0 {
				fmt.Fprintf(stderr, "unfinished downloads (ats pull the same model again to resume it, ats rm NAME to delete it):\n")
				for _, u := range us {
					fmt.Fprintf(stderr, "  %s: %s so far\n", u.Name, sizeStr(u.Bytes))
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "rm NAME...",
		Aliases:           []string{"remove"},
		Short:             "Delete pulled models",
		Long:              "rm deletes pulled models (by any of their names) and their files from the models directory, or the unfinished download of a model (ats list names them). A registered local file stays: only its link goes.",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: completePulled,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := hub.OpenStore()
			if err != nil {
				return fmt.Errorf("rm: %w", err)
			}
			for _, name := range args {
				m, err := st.Remove(name)
				var nf *hub.NotFoundError
				if errors.As(err, &nf) {
					// Not a model: maybe a download that never finished.
					if u, uerr := st.RemoveUnfinished(name); uerr == nil {
						fmt.Fprintf(cmd.OutOrStdout(), "removed the unfinished download of %s (%s)\n", u.Name, sizeStr(u.Bytes))
						continue
					}
				}
				if err != nil {
					return fmt.Errorf("rm: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s (%s)\n", m.Name, sizeStr(m.Size()))
			}
			return nil
		},
	}
}

func newShowCmd() *cobra.Command {
	var asJSON, tensors bool
	cmd := &cobra.Command{
		Use:   "show MODEL",
		Short: "Show a model: where it came from, what it holds, its chat template",
		Long: `show prints what ats inspect does (architecture, parameters, hyperparameters,
tokenizer) and the chat template's text, and for a pulled model its names,
source, revision and files with their sha256. MODEL is a pulled model's
name or a file.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeModelArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := resolveModel(args[0])
			if err != nil {
				return fmt.Errorf("show: %w", err)
			}
			var m *hub.Manifest
			if st, err := hub.OpenStore(); err == nil {
				if mm, err := st.Find(args[0]); err == nil && mm.Path() == path {
					m = mm
				}
			}
			f, err := gguf.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			r := inspectModel(f)
			if !tensors {
				r.Tensors = nil
			}
			out := cmd.OutOrStdout()
			if asJSON {
				r.ChatTemplate.Text = r.ChatTemplate.text
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(struct {
					Model *hub.Manifest `json:"model"` // null for a file that was not pulled
					*inspectReport
				}{m, r})
			}
			if m != nil {
				writeManifest(out, m)
			}
			if err := r.writeText(out, tensors); err != nil {
				return err
			}
			return r.writeTemplate(out, isTerminal(out))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().BoolVar(&tensors, "tensors", false, "list every tensor too")
	return cmd
}

// writeManifest prints what the models directory knows of a model.
func writeManifest(out io.Writer, m *hub.Manifest) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "model:\t%s\n", m.Name)
	if len(m.Aliases) > 0 {
		fmt.Fprintf(tw, "also called:\t%s\n", strings.Join(m.Aliases, ", "))
	}
	fmt.Fprintf(tw, "source:\t%s\n", m.Source)
	if m.Revision != "" {
		fmt.Fprintf(tw, "revision:\t%s\n", m.Revision)
	}
	fmt.Fprintf(tw, "pulled:\t%s\n", m.Pulled.Local().Format("2006-01-02 15:04"))
	for _, f := range m.Files {
		check := "verified"
		if !f.Verified {
			check = "not published by the source"
		}
		fmt.Fprintf(tw, "file:\t%s (%s), sha256 %s (%s)\n", f.Name, sizeStr(f.Size), f.SHA256, check)
	}
	fmt.Fprintln(tw)
	tw.Flush()
}

// importLocal registers a local GGUF file (ats pull ./file.gguf).
func importLocal(cmd *cobra.Command, path string, opt hub.PullOptions) error {
	f, err := gguf.Open(path)
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	quant := ""
	if ft, err := f.Uint("general.file_type"); err == nil {
		quant = strings.TrimSuffix(llamaFileTypeName(ft), " (guessed)")
	}
	f.Close()
	st, err := hub.OpenStore()
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	if opt.SHA256 != "" {
		return errors.New("pull: --sha256 checks downloads; a local file is registered as it is")
	}
	m, err := st.Import(path, hub.ImportOptions{Name: opt.Name, Aliases: opt.Aliases, Quant: quant})
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "registered %s as %s (%s, %s)\n", path, m.Name, quantOrDash(m.Quant), sizeStr(m.Size()))
	fmt.Fprintf(out, "run it: ats run %s\n", m.Name)
	return nil
}

func quantOrDash(q string) string {
	if q == "" {
		return "-"
	}
	return q
}
