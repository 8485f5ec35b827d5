package main

import (
	"bufio"
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The service files in dist/ run `ats serve` with a command line that
// this ats accepts: the systemd unit's ExecStart with the environment its
// unit and ats.env give, and the launchd agent's ProgramArguments.

// parseServe checks that args (without the program name) are a valid `ats
// serve` command line, without running it.
func parseServe(t *testing.T, args []string) {
	t.Helper()
	root := newRootCmd()
	cmd, rest, err := root.Find(llamaSpellings(args))
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if cmd.Name() != "serve" {
		t.Fatalf("%q runs ats %s, want ats serve", args, cmd.Name())
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
}

// envLine matches KEY=VALUE in an environment file or an Environment=
// setting.
var envLine = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(.*)$`)

func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join("..", "..", "dist", "ats.service"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	var execStart string
	sc := bufio.NewScanner(strings.NewReader(string(unit)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "Environment="):
			if m := envLine.FindStringSubmatch(strings.TrimPrefix(line, "Environment=")); m != nil {
				env[m[1]] = m[2]
			}
		case strings.HasPrefix(line, "ExecStart="):
			execStart = strings.TrimPrefix(line, "ExecStart=")
		}
	}
	if execStart == "" {
		t.Fatal("no ExecStart")
	}
	envFile, err := os.ReadFile(filepath.Join("..", "..", "dist", "ats.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(envFile), "\n") {
		if m := envLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			env[m[1]] = m[2]
		}
	}
	for _, k := range []string{"ATS_MODEL", "ATS_HOST", "ATS_PORT", "ATS_SERVE_FLAGS", "ATS_MODELS", "ATS_CACHE_DIR"} {
		if _, ok := env[k]; !ok {
			t.Errorf("%s is set neither in ats.service nor in ats.env", k)
		}
	}
	// systemd's expansion: ${VAR} is one word, $VAR splits at whitespace.
	var args []string
	for _, w := range strings.Fields(execStart) {
		switch {
		case strings.HasPrefix(w, "${") && strings.HasSuffix(w, "}"):
			args = append(args, env[w[2:len(w)-1]])
		case strings.HasPrefix(w, "$"):
			args = append(args, strings.Fields(env[w[1:]])...)
		default:
			args = append(args, w)
		}
	}
	if args[0] != "/usr/local/bin/ats" {
		t.Errorf("ExecStart runs %s", args[0])
	}
	want := []string{"serve", "qwen3-8b:q4_k_m", "--host", "127.0.0.1", "--port", "8080", "--ctx-size", "8192"}
	if diff := cmp.Diff(want, args[1:]); diff != "" {
		t.Errorf("ExecStart expands to (-want +got):\n%s", diff)
	}
	parseServe(t, args[1:])
}

func TestLaunchdPlist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "dist", "io.github.atsinfer.ats.plist"))
	if err != nil {
		t.Fatal(err)
	}
	// A property list's top dict: <key> then its value, in order.
	var doc struct {
		Dict struct {
			Items []struct {
				XMLName xml.Name
				Text    string   `xml:",chardata"`
				Strings []string `xml:"string"`
			} `xml:",any"`
		} `xml:"dict"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("the plist is not well-formed XML: %v", err)
	}
	values := map[string]int{}
	items := doc.Dict.Items
	for i := 0; i+1 < len(items); i += 2 {
		if items[i].XMLName.Local != "key" {
			t.Fatalf("item %d is <%s>, want <key>", i, items[i].XMLName.Local)
		}
		values[items[i].Text] = i + 1
	}
	if i, ok := values["Label"]; !ok || items[i].Text != "io.github.atsinfer.ats" {
		t.Errorf("Label missing or not the file's name")
	}
	i, ok := values["ProgramArguments"]
	if !ok || items[i].XMLName.Local != "array" {
		t.Fatal("no ProgramArguments array")
	}
	args := items[i].Strings
	if len(args) < 3 || args[0] != "/usr/local/bin/ats" {
		t.Fatalf("ProgramArguments %q", args)
	}
	parseServe(t, args[1:])
	for _, k := range []string{"RunAtLoad", "KeepAlive", "StandardErrorPath"} {
		if _, ok := values[k]; !ok {
			t.Errorf("no %s", k)
		}
	}
}
