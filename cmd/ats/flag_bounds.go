package main

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Sizes and counts from flags are checked against their meaning before a
// command runs: a negative context size used to be taken for "the
// model's" (0) and a batch of 0 or -1 for the default, silently (issue
// 33). The bounds are by flag name, so every command that has the flag
// gets them, the ones added later included.

// flagBound is the range an integer flag's value must be in.
type flagBound struct {
	min, max int
	means    string // what the smallest allowed values mean, for the error
}

var flagBounds = map[string]flagBound{
	"ctx-size":    {0, 1 << 30, "0 is the command's default: see its help"},
	"batch-size":  {1, 1 << 30, "the most prompt tokens computed together"},
	"threads":     {0, 1 << 20, "0 is all cores"},
	"n-predict":   {-1, 1 << 30, "-1 is until the end of the turn"},
	"n-gen":       {0, 1 << 30, "0 is none"},
	"repetitions": {1, 1 << 20, "at least one run"},
	"queue":       {0, 1 << 20, "0 accepts a request only when the model is idle"},
	"port":        {0, 65535, "0 is any free port"},
}

// checkFlagBounds makes every command under root check its integer flags
// against flagBounds before it runs.
func checkFlagBounds(root *cobra.Command) {
	for _, c := range root.Commands() {
		checkFlagBounds(c)
		prev := c.PreRunE
		c.PreRunE = func(cmd *cobra.Command, args []string) error {
			if err := flagsInBounds(cmd.Flags()); err != nil {
				return fmt.Errorf("%s: %w", cmd.Name(), err)
			}
			if prev != nil {
				return prev(cmd, args)
			}
			return nil
		}
	}
}

func flagsInBounds(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		b, ok := flagBounds[f.Name]
		if !ok || err != nil || f.Value.Type() != "int" {
			return
		}
		v, perr := strconv.Atoi(f.Value.String())
		if perr != nil {
			return // not set by us: pflag already refused what does not parse
		}
		if v < b.min || v > b.max {
			err = fmt.Errorf("--%s %d: must be from %d to %d (%s)", f.Name, v, b.min, b.max, b.means)
		}
	})
	return err
}
