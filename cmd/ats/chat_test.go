package main

import (
	"errors"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/server"
)

// TestMain lets the test binary stand in for the ats binary: run with
// ATS_TEST_MAIN=1 it is ats. The pseudo-terminal tests start it that way,
// so they need no separate build.
func TestMain(m *testing.M) {
	if os.Getenv("ATS_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lines is a lineSource over fixed lines.
type lines []string

func (l *lines) readLine(string) (string, error) {
	if len(*l) == 0 {
		return "", io.EOF
	}
	s := (*l)[0]
	*l = (*l)[1:]
	return s, nil
}

func (l *lines) close() {}

func TestTurnReader(t *testing.T) {
	src := lines{
		"hello",
		`first \`, `second \`, "third",
		`"""`, "a", "", "b", `"""`,
		`"""one line"""`,
		`  """x`, `y"""`,
		"/set temp 0",
		`"""`, "unterminated",
	}
	tr := &turnReader{src: &src}
	want := []string{"hello", "first \nsecond \nthird", "a\n\nb", "one line", "x\ny", "/set temp 0", "unterminated"}
	for i, w := range want {
		got, err := tr.readTurn()
		if err != nil || got != w {
			t.Fatalf("turn %d: %q, %v; want %q", i, got, err, w)
		}
	}
	if _, err := tr.readTurn(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last turn: %v", err)
	}
}

var speedLine = regexp.MustCompile(`\[(\d+) tokens, [\d.]+ tokens/s · prompt (\d+) tokens \((\d+) cached\)`)

// TestChatPiped runs chat with turns and commands from a pipe.
func TestChatPiped(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	stdin := strings.Join([]string{
		"Hello there",
		"/set temp 0",
		"/set nonsense 1",
		"/set top_p 7",
		`"""`, "A question", "on two lines", `"""`,
		"/stats",
		"/system Be brief.",
		"/clear",
		"After the clear",
		"/exit",
		"never sent",
	}, "\n") + "\n"
	out, stderr, err := runATSIn(t, stdin, "chat", "-m", m, "-n", "6", "--seed", "3", "-t", "2", "--logit-bias", "2-inf", "--history", "")
	if err != nil {
		t.Fatalf("%v\nstderr: %s", err, stderr)
	}
	speeds := speedLine.FindAllStringSubmatch(stderr, -1)
	if len(speeds) != 3 {
		t.Fatalf("%d answers, want 3\nstdout: %s\nstderr: %s", len(speeds), out, stderr)
	}
	for _, s := range speeds {
		if s[1] != "6" {
			t.Errorf("answer of %s tokens, want 6 (-n 6)", s[1])
		}
	}
	// The second turn continues the conversation: its prompt is longer and
	// reuses the first one's cache. After /clear the prompt is short again.
	num := func(s string) int { n, _ := strconv.Atoi(s); return n }
	if num(speeds[1][2]) <= num(speeds[0][2]) || num(speeds[1][3]) < num(speeds[0][2]) {
		t.Errorf("second turn: prompt %s tokens (%s cached), first %s", speeds[1][2], speeds[1][3], speeds[0][2])
	}
	if speeds[2][3] != "0" {
		t.Errorf("after /clear, %s tokens were cached", speeds[2][3])
	}
	for _, want := range []string{
		"(temp 0, top_k 40",
		`error: no setting "nonsense"`,
		"error: invalid sampler config: top_p 7",
		"2 exchanges in the conversation",
		"(system prompt set)",
		"(conversation cleared)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "never sent") || strings.Contains(out, "Chatting with") {
		t.Errorf("stdout:\n%s", out)
	}
	if !strings.Contains(stderr, "ats: loaded tiny-qwen3-q4_k_m.gguf") {
		t.Errorf("no load line: %s", stderr)
	}
}

// TestChatDisplay checks how a reasoning reply is shown without a
// terminal: the thinking marked off, then the answer.
func TestChatDisplay(t *testing.T) {
	var b strings.Builder
	p := server.NewStreamParser(server.ParseOptions{Format: server.FormatHermes})
	d := &display{w: &b}
	for _, piece := range []string{"<thi", "nk>\nHmm.", "\n</think>\n\nHi", "!"} {
		d.show(p.Push(piece))
	}
	d.show(p.Finish())
	d.end()
	if got, want := b.String(), "Thinking...\nHmm.\n...done thinking.\n\nHi!\n"; got != want {
		t.Errorf("display %q, want %q", got, want)
	}
	b.Reset()
	d = &display{w: &b, color: true}
	d.show(server.Delta{Reasoning: "x"})
	d.show(server.Delta{Content: "y"})
	d.end()
	if got, want := b.String(), "\x1b[2mx\x1b[0m\n\ny\n"; got != want {
		t.Errorf("colour display %q, want %q", got, want)
	}
}
