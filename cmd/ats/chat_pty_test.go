//go:build unix

package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
)

// terminal is ats running on a pseudo-terminal, driven as a person would:
// type, wait for what appears.
type terminal struct {
	t    *testing.T
	pty  *os.File
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	seen int // output before this offset has been matched
	done chan struct{}
}

// startTerminal runs the test binary as ats (see TestMain) on a new
// pseudo-terminal, which becomes its controlling terminal, so Ctrl-C
// typed there interrupts it as it would a real one.
func startTerminal(t *testing.T, args ...string) *terminal {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ATS_TEST_MAIN=1", "NO_COLOR=1", "TERM=xterm")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	tm := &terminal{t: t, pty: f, cmd: cmd, done: make(chan struct{})}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			tm.mu.Lock()
			tm.out.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				close(tm.done)
				return
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		f.Close()
		cmd.Wait()
	})
	return tm
}

// expect waits for output matching re after what was matched before.
func (tm *terminal) expect(re string) string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(15 * time.Second)
	for {
		tm.mu.Lock()
		rest := tm.out.Bytes()[tm.seen:]
		if loc := rx.FindIndex(rest); loc != nil {
			m := string(rest[loc[0]:loc[1]])
			tm.seen += loc[1]
			tm.mu.Unlock()
			return m
		}
		tm.mu.Unlock()
		select {
		case <-tm.done:
			tm.t.Fatalf("ats ended before %q appeared; output:\n%s", re, tm.output())
		default:
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("timed out waiting for %q; output after the last match:\n%q", re, rest)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

func (tm *terminal) typeText(s string) {
	tm.t.Helper()
	if _, err := io.WriteString(tm.pty, s); err != nil {
		tm.t.Fatal(err)
	}
}

// wait waits for ats to exit and returns its exit code.
func (tm *terminal) wait() int {
	tm.t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- tm.cmd.Wait() }()
	select {
	case <-exited:
		return tm.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		tm.t.Fatalf("ats did not exit; output:\n%s", tm.output())
	}
	return -1
}

const speed = `\[\d+ tokens, [\d.]+ tokens/s · prompt \d+ tokens \(\d+ cached\)`

// TestChatTerminal talks with a model through a pseudo-terminal: prompts,
// streamed answers with their speed, /set, history recall with the up
// arrow, multi-line input, Ctrl-C stopping an answer but not the program,
// Ctrl-C dropping a typed line, and Ctrl-D quitting.
func TestChatTerminal(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	hist := filepath.Join(t.TempDir(), "history")
	// A large context and no end-of-turn token (2 is </s>), so an answer
	// without a limit runs for seconds: time to interrupt it.
	tm := startTerminal(t, "chat", "-m", m, "-c", "4096", "-n", "8", "--seed", "3", "--logit-bias", "2-inf", "-t", "2", "--history", hist)
	tm.expect(`loading tiny-qwen3-q4_k_m\.gguf`) // the progress bar
	tm.expect(`Chatting with tiny-qwen3-q4_k_m\.gguf`)
	tm.expect(`>>> `)

	tm.typeText("Hello there\r")
	tm.expect(`\[8 tokens, [\d.]+ tokens/s · prompt \d+ tokens \(0 cached\)`)
	tm.expect(`>>> `)

	tm.typeText("/set temp 0\r")
	tm.expect(`\(temp 0, top_k 40`)
	tm.expect(`>>> `)
	// The up arrow brings the last line back.
	tm.typeText("\x1b[A")
	tm.expect(`/set temp 0`)
	tm.typeText("\r")
	tm.expect(`\(temp 0, top_k 40`)
	tm.expect(`>>> `)

	// Multi-line input, in a """ block; the second turn reuses the cache.
	tm.typeText(`"""` + "\r")
	tm.expect(`\.\.\. `)
	tm.typeText("first line\r")
	tm.expect(`\.\.\. `)
	tm.typeText(`second line"""` + "\r")
	tm.expect(`\[8 tokens, [\d.]+ tokens/s · prompt \d+ tokens \([1-9]\d* cached\)`)
	tm.expect(`>>> `)

	// Ctrl-C stops a long answer and the chat goes on.
	tm.typeText("/set max_tokens -1\r")
	tm.expect(`max_tokens no limit`)
	tm.expect(`>>> `)
	tm.typeText("Tell me everything\r")
	tm.expect(`(?s)Tell me everything\r\n.`) // the answer has begun
	tm.typeText("\x03")
	tm.expect(speed + `, [\d.]+ tokens/s · stopped\]`)
	tm.expect(`>>> `)
	tm.typeText("/stats\r")
	tm.expect(`3 exchanges in the conversation`)
	tm.expect(`>>> `)

	// Ctrl-C with text typed drops the text; then Ctrl-D quits.
	tm.typeText("half a thought")
	tm.expect(`half a thought`)
	tm.typeText("\x03")
	tm.expect(`>>> `)
	tm.typeText("/clear\r")
	tm.expect(`\(conversation cleared\)`)
	tm.expect(`>>> `)
	tm.typeText("\x04")
	if code := tm.wait(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	b, err := os.ReadFile(hist)
	if err != nil || !strings.Contains(string(b), "/set temp 0") || !strings.Contains(string(b), "Hello there") {
		t.Errorf("history file: %q, %v", b, err)
	}
}

// TestChatTerminalQuit: Ctrl-C at an empty prompt quits, and so does /exit.
func TestChatTerminalQuit(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	for _, key := range []string{"\x03", "/exit\r"} {
		tm := startTerminal(t, "chat", "-m", m, "-t", "2", "--history", "")
		tm.expect(`>>> `)
		tm.typeText(key)
		if code := tm.wait(); code != 0 {
			t.Errorf("%q: exit code %d", key, code)
		}
	}
}
