//go:build unix

package main

import "testing"

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
