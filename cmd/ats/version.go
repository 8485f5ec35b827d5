package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Release builds set these with -ldflags (see .goreleaser.yaml):
// -X main.version=v0.1.0 -X main.commit=SHA -X main.date=RFC3339.
var (
	version = "dev"
	commit  = ""
	date    = ""
)

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
// version, the commit it was built from and when, the Go version and the
// platform.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return fmt.Sprintf("ats %s%s %s %s/%s", versionOf(version, bi), commitOf(commit, date, bi), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// versionOf is the version set at build time, else the module version Go
// recorded (go install github.com/atsinfer/ats/cmd/ats@v0.1.0 records
// v0.1.0), else "dev".
func versionOf(set string, bi *debug.BuildInfo) string {
	if set != "dev" && set != "" {
		return set
	}
	if bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// commitOf is " (commit COMMIT, built DATE)" for a release build, whose
// commit and date were set at build time; otherwise " (commit COMMIT[,
// modified][, DATE])" from the VCS settings Go records when it builds in a
// git checkout, and "" without them (go run, go test, a build outside git).
func commitOf(setCommit, setDate string, bi *debug.BuildInfo) string {
	if setCommit != "" {
		s := " (commit " + short(setCommit)
		if len(setDate) >= 10 {
			s += ", built " + setDate[:10]
		}
		return s + ")"
	}
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
	s := " (commit " + short(rev)
	if modified {
		s += ", modified"
	}
	if len(when) >= 10 {
		s += ", " + when[:10]
	}
	return s + ")"
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
