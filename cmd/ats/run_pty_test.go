//go:build unix

package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/creack/pty"
)

// TestRunTerminalChats: ats run MODEL in a terminal without a prompt
// starts a chat rather than waiting on stdin in silence, with run's
// sampling flags, and says so in one line.
func TestRunTerminalChats(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	tm := startTerminal(t, "run", m, "-n", "5", "--seed", "3", "--logit-bias", "2-inf", "-t", "2", "--raw")
	tm.expect(`no prompt given \(-p, -f or a pipe\): starting a chat`)
	tm.expect(`--raw only applies to a single prompt`)
	tm.expect(`loading tiny-qwen3-q4_k_m\.gguf`) // the progress bar
	tm.expect(`ats: loaded tiny-qwen3-q4_k_m\.gguf .* in [\d.]+s`)
	tm.expect(`Chatting with tiny-qwen3-q4_k_m\.gguf`)
	tm.expect(`>>> `)
	tm.typeText("Hello\r")
	tm.expect(`\[5 tokens, [\d.]+ tokens/s · prompt \d+ tokens \(0 cached\)`) // -n 5 carried over
	tm.expect(`>>> `)
	tm.typeText("\x04")
	if code := tm.wait(); code != 0 {
		t.Errorf("exit code %d", code)
	}
}

// TestRunTerminalToFile: with the reply going to a file, run reads the
// prompt from the terminal as before, and says how to end it.
func TestRunTerminalToFile(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var stdout bytes.Buffer
	cmd := exec.Command(os.Args[0], "run", m, "--raw", "-n", "3", "--print-tokens", "-t", "2")
	cmd.Env = append(os.Environ(), "ATS_TEST_MAIN=1")
	cmd.Stdin, cmd.Stderr, cmd.Stdout = tty, tty, &stdout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	tm := &terminal{t: t, pty: ptmx, cmd: cmd, done: make(chan struct{})}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			tm.mu.Lock()
			tm.out.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				close(tm.done)
				return
			}
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	tm.expect(`type the prompt, then Ctrl-D`)
	tm.typeText("hello world\n\x04")
	if code := tm.wait(); code != 0 {
		t.Fatalf("exit code %d; terminal:\n%s", code, tm.output())
	}
	if f := strings.Fields(stdout.String()); len(f) != 3 {
		t.Errorf("stdout %q, want 3 token ids", stdout.String())
	}
}
