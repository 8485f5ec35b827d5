package main

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFlagBounds: sizes from flags are checked before anything big is
// allocated, with errors that say what to do (issue 13).
func TestFlagBounds(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-m", m, "-p", "x", "-c", "100000000"}, "context"},
		{[]string{"run", "-m", m, "-p", "x", "-t", "20000"}, "threads"},
		{[]string{"run", "-m", m, "-p", "x", "-c", "256", "--repeat-penalty", "1.1", "--repeat-last-n", "10000000000"}, "repeat_last_n"},
		{[]string{"chat", "-m", m, "-c", "256", "--repeat-last-n", "1000", "--history", ""}, "repeat_last_n"},
	} {
		start := time.Now()
		_, _, err := runATSIn(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to mention %q", tc.args, err, tc.want)
		}
		t.Logf("%v: %v (%v)", tc.args[5:], err, time.Since(start).Round(time.Millisecond))
	}
}

// TestChatKeepsHistoryWhenTooLong: a message too long for the context is
// refused, and the conversation before it stays.
func TestChatKeepsHistoryWhenTooLong(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	long := strings.Repeat("word ", 400)
	stdin := "hello\n" + long + "\n/set repeat_last_n 100000\n/stats\n"
	out, stderr, err := runATSIn(t, stdin, "chat", "-m", m, "-c", "256", "-n", "4", "--seed", "1", "-t", "2", "--history", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "too long") {
		t.Errorf("no note about the long message; stderr:\n%s", stderr)
	}
	if !strings.Contains(out, "1 exchanges in the conversation") {
		t.Errorf("the conversation was not kept; stdout:\n%s", out)
	}
	if !strings.Contains(out, "error: repeat_last_n 100000 is more than the context") {
		t.Errorf("/set repeat_last_n past the context accepted; stdout:\n%s", out)
	}
}

// TestServeBusyPort: a busy port is reported before the model loads.
func TestServeBusyPort(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_, stderr, err := runATSIn(t, "", "serve", "-m", m, "--port", port, "-t", "2")
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("serve on a busy port: %v", err)
	}
	if strings.Contains(stderr, "loaded") {
		t.Errorf("the model was loaded before the port was taken:\n%s", stderr)
	}
}
