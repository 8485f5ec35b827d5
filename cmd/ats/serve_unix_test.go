//go:build unix

package main

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestServeSignal runs ats serve as a process and stops it with SIGTERM
// while a streamed answer is running: the answer completes, then the
// server exits cleanly.
func TestServeSignal(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	cmd := exec.Command(os.Args[0], "serve", "-m", m, "--port", "0", "-t", "2", "-c", "512")
	cmd.Env = append(os.Environ(), "ATS_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var log []string
	waitLine := func(sub string) string {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("stderr ended before %q:\n%s", sub, strings.Join(log, "\n"))
				}
				log = append(log, l)
				if strings.Contains(l, sub) {
					return l
				}
			case <-timeout:
				t.Fatalf("no %q on stderr:\n%s", sub, strings.Join(log, "\n"))
			}
		}
	}
	url := servingRE.FindStringSubmatch(waitLine("serving on"))[1]

	// A long streamed answer (no end-of-turn token, 400 tokens).
	body := `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":400,"logit_bias":{"2":-100}}`
	resp, err := httpPost(url+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first event")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var last string
	done := false
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") {
			if l == "data: [DONE]" {
				done = true
			} else {
				last = l
			}
		}
	}
	if !done || !strings.Contains(last, `"finish_reason":"length"`) {
		t.Errorf("the answer was cut by the shutdown: done %v, last %q", done, last)
	}
	waitLine("shutting down")
	waitLine("ats: stopped")
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit: %v", err)
	}
}
