package sampler

import (
	"slices"
	"strings"
	"testing"
)

// splits calls f with every way of cutting s into non-empty pieces
// (2^(len-1) of them), byte-wise, so multi-byte characters get split too.
func splits(s string, f func([]string)) {
	n := len(s)
	for mask := 0; mask < 1<<(n-1); mask++ {
		var pieces []string
		start := 0
		for i := 1; i < n; i++ {
			if mask&(1<<(i-1)) != 0 {
				pieces = append(pieces, s[start:i])
				start = i
			}
		}
		pieces = append(pieces, s[start:])
		f(pieces)
	}
}

func TestStopMatcherAllSplits(t *testing.T) {
	for _, tc := range []struct {
		text    string
		stops   []string
		want    string // everything emitted, including Flush
		stopped bool
	}{
		{"Hi<|end|>World", []string{"<|end|>"}, "Hi", true},
		{"abcabdzz", []string{"abd"}, "abc", true},     // a partial match that fails, then a real one
		{"xx<|e", []string{"<|end|>"}, "xx<|e", false}, // ends inside a partial match: Flush gives it back
		{"xabcdq", []string{"bcq", "abcd"}, "x", true}, // earliest start wins
		{"zabcq", []string{"abc", "ab"}, "z", true},    // one stop is a prefix of another
		{"STOPabc", []string{"STOP"}, "", true},        // at the very start
		{"aaabq", []string{"aab"}, "a", true},          // self-overlapping prefix
		{"héllo 世界!", []string{"世界"}, "héllo ", true},  // multi-byte, split mid-character
		{"no stop here", []string{"zz", "", "hereX"}, "no stop here", false},
		{"plain", nil, "plain", false},
		{"a\n\nUser:", []string{"\n\nUser:", "User:"}, "a", true}, // both complete together

	} {
		splits(tc.text, func(pieces []string) {
			m := NewStopMatcher(tc.stops)
			var out strings.Builder
			var fed string
			stopped := false
			for _, p := range pieces {
				emit, st := m.Push(p)
				out.WriteString(emit)
				fed += p
				if st {
					stopped = true
					break
				}
				// Nothing is held back that could not start a stop string,
				// and nothing is lost.
				if out.String()+m.pending != fed {
					t.Fatalf("%q split %q: emitted %q + held %q != fed %q", tc.text, pieces, out.String(), m.pending, fed)
				}
				if m.pending != "" && !slices.ContainsFunc(m.stops, func(s string) bool {
					return len(m.pending) < len(s) && strings.HasPrefix(s, m.pending)
				}) {
					t.Fatalf("%q split %q: held back %q, which starts no stop string", tc.text, pieces, m.pending)
				}
			}
			if !stopped {
				out.WriteString(m.Flush())
			}
			if out.String() != tc.want || stopped != tc.stopped || m.Stopped() != tc.stopped {
				t.Fatalf("%q split %q: emitted %q stopped=%v, want %q stopped=%v",
					tc.text, pieces, out.String(), stopped, tc.want, tc.stopped)
			}
		})
	}
}

// A stop string that completes first ends generation, even if a longer one
// that started earlier was still only partly matched: that one can no
// longer complete, so the text it had held back is real output.
func TestStopMatcherFirstCompletionWins(t *testing.T) {
	m := NewStopMatcher([]string{"\n\nUser:", "\nUser"})
	if emit, st := m.Push("a\n\nUs"); emit != "a" || st {
		t.Fatalf("Push = %q, %v; want \"a\", not stopped", emit, st)
	}
	if emit, st := m.Push("er"); emit != "\n" || !st {
		t.Fatalf("Push = %q, %v; want \"\\n\", stopped", emit, st)
	}
}

func TestStopMatcherAfterStop(t *testing.T) {
	m := NewStopMatcher([]string{"END"})
	if emit, st := m.Push("aEND b"); emit != "a" || !st {
		t.Fatalf("Push = %q, %v", emit, st)
	}
	if emit, st := m.Push("more"); emit != "" || !st {
		t.Errorf("Push after stop = %q, %v; want nothing, stopped", emit, st)
	}
	if f := m.Flush(); f != "" {
		t.Errorf("Flush after stop = %q, want empty (the stop text is never emitted)", f)
	}
	m.Reset()
	if emit, st := m.Push("xEN"); emit != "x" || st {
		t.Errorf("after Reset: Push = %q, %v; want \"x\", not stopped", emit, st)
	}
}

// Matched names the stop string that ended the text: the earliest one.
func TestStopMatched(t *testing.T) {
	m := NewStopMatcher([]string{"END", "b c"})
	if m.Matched() != "" {
		t.Fatal("matched before any text")
	}
	for _, p := range []string{"a ", "b", " c END"} {
		m.Push(p)
	}
	if !m.Stopped() || m.Matched() != "b c" {
		t.Errorf("stopped %v matched %q", m.Stopped(), m.Matched())
	}
	m.Reset()
	if m.Matched() != "" {
		t.Error("Reset keeps the match")
	}
}
