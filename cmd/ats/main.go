// Command ats runs GGUF language models on machines whose GPU is too small
// for the model. Each subcommand lives in its own file.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ats",
		Short: "Run large language models on a small GPU and a CPU",
		Long: `ats runs GGUF language models (Qwen3, Qwen3-MoE, GLM-4, Llama 3, ...) on a
machine whose GPU is too small for the model: it measures every weight tensor
on the CPU and the GPU, keeps on the GPU the tensors that save the most time
per byte, and streams or computes the rest on the CPU.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, add := range commands {
		root.AddCommand(add())
	}
	return root
}

// commands collects the constructors of the subcommands; each command's file
// registers itself in an init function so files can be added independently.
var commands []func() *cobra.Command

func register(c func() *cobra.Command) { commands = append(commands, c) }

func main() {
	if err := newRootCmd().Execute(); err != nil {
		var status exitStatus
		if errors.As(err, &status) {
			os.Exit(int(status))
		}
		fmt.Fprintln(os.Stderr, "ats:", err)
		os.Exit(1)
	}
}
