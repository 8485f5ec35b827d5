package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// stdinIsTerminal reports whether the command reads a terminal: run then
// has no prompt to wait for and starts a chat instead.
func stdinIsTerminal(cmd *cobra.Command) bool {
	return cmd.InOrStdin() == io.Reader(os.Stdin) && isTerminal(os.Stdin)
}

// readPromptFile reads run's -f FILE; "-" is standard input.
func readPromptFile(cmd *cobra.Command, name string) ([]byte, error) {
	if name == "-" {
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("run: reading the prompt from stdin: %w", err)
		}
		return b, nil
	}
	st, err := os.Stat(name)
	if err == nil && st.IsDir() {
		return nil, fmt.Errorf("run: -f %s is a directory, not a prompt file", name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("run: -f: %w", err)
	}
	return b, nil
}

// runAsChat runs `ats chat` with run's flags: what `ats run MODEL` does in
// a terminal without a prompt, where it would otherwise wait on stdin in
// silence. Flags that only make sense for one prompt are noted and left.
func runAsChat(run *cobra.Command) error {
	chat, _, err := run.Root().Find([]string{"chat"})
	if err != nil || chat == nil || chat.Name() != "chat" {
		return fmt.Errorf("run: no prompt given (-p, -f or a pipe), and no chat command to fall back on")
	}
	stderr := run.ErrOrStderr()
	var ignored []string
	run.Flags().Visit(func(f *pflag.Flag) {
		if f.Name == "model" {
			return
		}
		cf := chat.Flags().Lookup(f.Name)
		if cf == nil {
			ignored = append(ignored, "--"+f.Name)
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			if csv, ok := cf.Value.(pflag.SliceValue); ok {
				csv.Replace(sv.GetSlice())
				cf.Changed = true
				return
			}
		}
		chat.Flags().Set(f.Name, f.Value.String())
	})
	chat.Flags().Set("model", run.Flags().Lookup("model").Value.String())
	fmt.Fprintln(stderr, "ats: no prompt given (-p, -f or a pipe): starting a chat")
	if len(ignored) > 0 {
		verb := "apply"
		if len(ignored) == 1 {
			verb = "applies"
		}
		fmt.Fprintf(stderr, "ats: %s only %s to a single prompt\n", strings.Join(ignored, ", "), verb)
	}
	chat.SetContext(commandContext(run))
	return chat.RunE(chat, nil)
}
