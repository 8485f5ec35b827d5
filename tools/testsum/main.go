// Command testsum runs go test and ends with what it skipped and why,
// counted: the tests that need a GPU or a browser skip where there is none,
// and `go test` alone prints "ok" for a package whatever it skipped.
//
//	go run ./tools/testsum                 # go test ./...
//	go run ./tools/testsum -race ./runtime # other go test flags and packages
//	go run ./tools/testsum -fail-skip 'test data' ./...
//
// It prints each package's result as go test does, the output of every
// failed test, then the skipped tests grouped by reason, and a last line
// "N passed, N failed, N skipped" (tests and subtests). Its exit status is
// go test's, or 1 when a skip's reason matches -fail-skip.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

// event is one line of go test -json (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output events
	Test       string
	Output     string
}

// skip is a skipped test and the reason it gave.
type skip struct {
	pkg, test, reason string
}

// summary collects a run's results.
type summary struct {
	passed, failed int
	skips          []skip
	output         map[string][]string // package/test → output lines, until the test ends
	out            io.Writer
}

func main() {
	failSkip := flag.String("fail-skip", "", "fail when a skipped test's reason matches this regular expression")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./tools/testsum [-fail-skip REGEXP] [go test flags] [packages]")
		flag.PrintDefaults()
	}
	// -fail-skip is ours; every other argument is go test's.
	var own, args []string
	for in := os.Args[1:]; len(in) > 0; in = in[1:] {
		switch a := in[0]; {
		case (a == "-fail-skip" || a == "--fail-skip") && len(in) > 1:
			own, in = append(own, a, in[1]), in[1:]
		case strings.HasPrefix(a, "-fail-skip=") || strings.HasPrefix(a, "--fail-skip=") || a == "-h" || a == "-help" || a == "--help":
			own = append(own, a)
		default:
			args = append(args, a)
		}
	}
	if err := flag.CommandLine.Parse(own); err != nil {
		os.Exit(2)
	}
	var failRE *regexp.Regexp
	if *failSkip != "" {
		re, err := regexp.Compile(*failSkip)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsum: -fail-skip: %v\n", err)
			os.Exit(2)
		}
		failRE = re
	}
	if !slices.ContainsFunc(args, func(a string) bool { return !strings.HasPrefix(a, "-") }) {
		args = append(args, "./...")
	}
	os.Exit(run(args, failRE, os.Stdout))
}

func run(args []string, failRE *regexp.Regexp, out io.Writer) int {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testsum: starting go test:", err)
		return 2
	}
	s := &summary{output: map[string][]string{}, out: out}
	if err := s.read(stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testsum: reading go test's output:", err)
	}
	status := 0
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			fmt.Fprintln(os.Stderr, "testsum: go test:", err)
			return 2
		}
		status = exit.ExitCode()
	}
	if s.report(failRE) && status == 0 {
		status = 1
	}
	return status
}

// read consumes go test -json's events, printing package results and the
// output of failed tests as they come.
func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Action == "" {
			// Not an event (go test prints some lines as they are).
			fmt.Fprintln(s.out, string(line))
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(s.out, e.Output)
		case e.Test == "":
			// The package's own lines: "ok  pkg 1.2s", "FAIL pkg", "? pkg
			// [no test files]", and what the test binary prints outside a test.
			if e.Action == "output" && e.Output != "PASS\n" {
				fmt.Fprint(s.out, e.Output)
			}
		case e.Action == "output":
			s.output[key] = append(s.output[key], e.Output)
		case e.Action == "pass":
			s.passed++
			delete(s.output, key)
		case e.Action == "fail":
			s.failed++
			fmt.Fprint(s.out, strings.Join(s.output[key], ""))
			delete(s.output, key)
		case e.Action == "skip":
			s.skips = append(s.skips, skip{pkg: e.Package, test: e.Test, reason: skipReason(s.output[key])})
			delete(s.output, key)
		}
	}
	return sc.Err()
}

// logLine is a line a test logged: "    file_test.go:12: message".
var logLine = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: (.*)$`)

// skipReason is the last message a test logged before it skipped (the
// t.Skip message), with its continuation lines.
func skipReason(lines []string) string {
	var reason []string
	for _, l := range lines {
		l = strings.TrimRight(l, "\n")
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "=== "), strings.HasPrefix(strings.TrimSpace(l), "--- "):
		case logLine.MatchString(l):
			reason = []string{logLine.FindStringSubmatch(l)[1]}
		case reason != nil:
			reason = append(reason, strings.TrimSpace(l))
		}
	}
	if reason == nil {
		return "(no reason given)"
	}
	return strings.Join(reason, " ")
}

// kind names what a skip needed, for grouping: the GPU and the browser
// tests give the machine's details in their reasons.
func kind(reason string) string {
	r := strings.ToLower(reason)
	switch {
	case strings.Contains(r, "gpu") || strings.Contains(r, "cuda"):
		return "needs a GPU with a CUDA driver"
	case strings.Contains(r, "chromium") || strings.Contains(r, "browser"):
		return "needs Chromium (the web UI's browser tests)"
	}
	return reason
}

// report prints the skips by kind and the counts. It returns whether a
// skip matched failRE.
func (s *summary) report(failRE *regexp.Regexp) bool {
	groups := map[string][]skip{}
	for _, sk := range s.skips {
		k := kind(sk.reason)
		groups[k] = append(groups[k], sk)
	}
	kinds := make([]string, 0, len(groups))
	for k := range groups {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int {
		if d := len(groups[b]) - len(groups[a]); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	failed := false
	if len(s.skips) > 0 {
		fmt.Fprintf(s.out, "\nskipped %d tests:\n", len(s.skips))
	}
	for _, k := range kinds {
		g := groups[k]
		fmt.Fprintf(s.out, "%5d  %s\n", len(g), clip(k, 160))
		if k != g[0].reason {
			fmt.Fprintf(s.out, "       for example: %s\n", clip(g[0].reason, 160))
		}
		var names []string
		for _, sk := range g {
			names = append(names, shortPkg(sk.pkg)+"."+sk.test)
		}
		fmt.Fprintf(s.out, "       %s\n", clip(strings.Join(names, ", "), 400))
	}
	if failRE != nil {
		for _, sk := range s.skips {
			if failRE.MatchString(sk.reason) {
				fmt.Fprintf(s.out, "FAIL: %s %s skipped, and -fail-skip %q says it must not: %s\n", sk.pkg, sk.test, failRE, sk.reason)
				failed = true
			}
		}
	}
	fmt.Fprintf(s.out, "%d passed, %d failed, %d skipped\n", s.passed, s.failed, len(s.skips))
	return failed
}

func shortPkg(p string) string {
	return strings.TrimPrefix(p, "github.com/atsinfer/ats/")
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
