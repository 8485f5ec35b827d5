package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=v0.1.0".
var version = "dev"

func init() {
	register(func() *cobra.Command {
		return &cobra.Command{
			Use:   "version",
			Short: "Print the ats version, its commit, Go version and platform",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), versionLine())
				return err
			},
		}
	})
}

// versionLine is what `ats version` and `ats --version` print: the
// version, the commit it was built from (from the build info Go records
// when building inside a git checkout) and the platform.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return fmt.Sprintf("ats %s%s %s %s/%s", version, commitOf(bi), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// commitOf is " (COMMIT[, modified][, DATE])" from the VCS settings of a
// build, "" when it has none (go run, go test, a build outside git).
func commitOf(bi *debug.BuildInfo) string {
	if bi == nil {
		return ""
	}
	var rev, when string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	s := " (commit " + rev
	if modified {
		s += ", modified"
	}
	if len(when) >= 10 {
		s += ", " + when[:10]
	}
	return s + ")"
}
