// Command ats runs GGUF language models on machines whose GPU is too small
// for the model. Each subcommand lives in its own file.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"

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
		Version:       versionLine(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	for _, add := range commands {
		root.AddCommand(add())
	}
	// The model commands' shared habits (model_args.go): the model as an
	// argument or a pulled name, -ngl, -v, value completion.
	adaptModelCommands(root)
	// llama.cpp's flags ats does not have, named as typed (llama_flags.go).
	root.SetFlagErrorFunc(flagError)
	setPlaceholders(root)
	checkFlagBounds(root) // flag_bounds.go
	return root
}

// commands collects the constructors of the subcommands; each command's file
// registers itself in an init function so files can be added independently.
var commands []func() *cobra.Command

func register(c func() *cobra.Command) { commands = append(commands, c) }

// exits are what a command leaves to do when ats ends (close a trace).
var exits []func()

// atExit registers f to run when ats ends, error or not.
func atExit(f func()) { exits = append(exits, f) }

func runExits() {
	for i := len(exits) - 1; i >= 0; i-- {
		exits[i]()
	}
	exits = nil
}

// EnvCPUProfile names a file to write a Go CPU profile of the whole
// command to (for `go tool pprof`): how a run spends its CPU time.
const EnvCPUProfile = "ATS_CPUPROFILE"

// EnvGoTrace names a file to write a Go execution trace of the whole
// command to (for `go tool trace`): which goroutines ran on which threads
// when, where a CPU profile only says what the CPU time went to (the CPU's
// share of a split MoE layer kept a quarter of the pool busy in a hybrid
// context; docs/bench/hybrid.md in the git history).
const EnvGoTrace = "ATS_GOTRACE"

// recordTo starts a recording of the whole command (start: a CPU profile,
// an execution trace) into the file that environment variable env names,
// if it names one; the function it returns stops the recording and closes
// the file.
func recordTo(env string, start func(io.Writer) error, stop func()) func() {
	path := os.Getenv(env)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		if err = start(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ats:", env+":", err)
		os.Exit(1)
	}
	return func() {
		stop()
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "ats:", env+":", err)
		}
	}
}

func main() {
	endTrace := recordTo(EnvGoTrace, trace.Start, trace.Stop)
	endProfile := recordTo(EnvCPUProfile, pprof.StartCPUProfile, pprof.StopCPUProfile)
	root := newRootCmd()
	root.SetArgs(llamaSpellings(os.Args[1:]))
	err := root.Execute()
	runExits()
	endProfile()
	endTrace()
	if err != nil {
		var status exitStatus
		if errors.As(err, &status) {
			os.Exit(int(status))
		}
		fmt.Fprintln(os.Stderr, "ats:", err)
		os.Exit(1)
	}
}
