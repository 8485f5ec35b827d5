//go:build unix

package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestRunInterruptExits130: Ctrl-C stops ats run with status 130, as a
// shell expects of an interrupted program (it exited 0).
func TestRunInterruptExits130(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	cmd := exec.Command(os.Args[0], "run", "-m", m, "--raw", "-p", "hello", "-c", "4096", "-t", "1", "--print-tokens", "--logit-bias", "2-inf")
	cmd.Env = append(os.Environ(), "ATS_TEST_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The first token id printed: generation runs.
	first := make(chan struct{})
	go func() {
		r := bufio.NewReader(stdout)
		if _, err := r.ReadByte(); err == nil {
			close(first)
		}
		for {
			if _, err := r.ReadByte(); err != nil {
				return
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("no output from ats run")
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("exit after Ctrl-C: %v, want status 130", err)
	}
	_ = syscall.SIGINT
}
