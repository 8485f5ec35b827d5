package main

import (
	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime"
	"github.com/atsinfer/ats/tools/synth"
)

// registerCompletions gives the flags of c that take a known set of
// values, a model or a GGUF file their shell completion (ats completion
// bash|zsh|fish|powershell prints the script).
func registerCompletions(c *cobra.Command) {
	values := func(vals ...string) cobra.CompletionFunc {
		return cobra.FixedCompletions(vals, cobra.ShellCompDirectiveNoFileComp)
	}
	gguf := func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"gguf"}, cobra.ShellCompDirectiveFilterFileExt
	}
	comps := map[string]cobra.CompletionFunc{
		"backend": values(
			runtime.BackendAuto+"\tthe GPU when one is usable, else the CPU",
			runtime.BackendCPU+"\tthe CPU only",
			runtime.BackendGPU+"\tevery op on the GPU"),
		"model": completeModel,
		"preset": func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			var out []string
			for _, p := range synth.Presets() {
				out = append(out, p.Name+"\t"+p.Description)
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		"layout": func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return synth.Layouts(), cobra.ShellCompDirectiveNoFileComp
		},
		"vocab":   gguf,
		"kv-type": values("f16", "q8_0", "q4_0", "f32"),
	}
	if c.Name() == "synth" {
		comps["output"] = gguf
	}
	if c.Name() == "bench" {
		comps["output"] = values("md", "json", "csv")
	}
	for name, fn := range comps {
		if c.Flags().Lookup(name) != nil {
			// Registering twice is an error; a command that registered
			// its own keeps it.
			_ = c.RegisterFlagCompletionFunc(name, fn)
		}
	}
}
