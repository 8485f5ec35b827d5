package main

import (
	"strings"
	"testing"
)

// Issue 33: -c -5 and bench -b 0 / -b -1 were accepted (taken for the
// defaults); each is an error naming the flag before anything loads.
func TestFlagBoundsByName(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-m", m, "-p", "x", "-c", "-5"}, "--ctx-size -5"},
		{[]string{"chat", "-m", m, "-c", "-1"}, "--ctx-size -1"},
		{[]string{"serve", "-m", m, "-c", "-5"}, "--ctx-size -5"},
		{[]string{"plan", "-m", m, "-b", "0"}, "--batch-size 0"},
		{[]string{"bench", "-m", m, "-b", "0", "-p", "8", "-n", "2"}, "--batch-size 0"},
		{[]string{"bench", "-m", m, "-b", "-1", "-p", "8", "-n", "2"}, "--batch-size -1"},
		{[]string{"bench", "-m", m, "-r", "0"}, "--repetitions 0"},
		{[]string{"run", "-m", m, "-p", "x", "-n", "-7"}, "--n-predict -7"},
		{[]string{"run", "-m", m, "-p", "x", "-t", "-2"}, "--threads -2"},
		{[]string{"serve", "-m", m, "--port", "70000"}, "--port 70000"},
		{[]string{"serve", "-m", m, "--queue", "-1"}, "--queue -1"},
	} {
		_, stderr, err := runATSIn(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to name %q", tc.args, err, tc.want)
		}
		if strings.Contains(stderr, "loaded") {
			t.Errorf("%v: the model was loaded before the flag was checked", tc.args)
		}
	}
	// The documented special values still work.
	if _, _, err := runATSIn(t, "", "run", "-m", m, "-p", "hi", "-n", "2", "-c", "0", "-t", "2"); err != nil {
		t.Errorf("-c 0: %v", err)
	}
}
