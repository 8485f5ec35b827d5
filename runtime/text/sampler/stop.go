package sampler

import "strings"

// StopMatcher finds stop strings in generated text that arrives in pieces
// (one detokenised token at a time), so a stop string split across tokens
// is still found and never shown to the user.
//
// Push returns the text that is safe to show now. It holds back the
// longest tail that could still grow into a stop string, so nothing it
// has emitted ever turns out to be part of one. When a stop string
// completes, Push emits the text before it, drops the stop string and
// everything after, and reports stopped. When generation ends for another
// reason (end-of-sequence token, token limit), Flush returns the held-back
// tail, which then belongs to the output.
type StopMatcher struct {
	stops   []string
	pending string // text received but not emitted yet
	stopped bool
	matched string // the stop string that stopped the text
}

// NewStopMatcher returns a matcher for the given stop strings; empty ones
// are ignored (they would match before any text).
func NewStopMatcher(stops []string) *StopMatcher {
	m := &StopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
		}
	}
	return m
}

// Push adds the next piece of text. emit is what may be shown now; stopped
// is true once a stop string has completed (then and on every later call,
// which emits nothing).
func (m *StopMatcher) Push(piece string) (emit string, stopped bool) {
	if m.stopped {
		return "", true
	}
	text := m.pending + piece
	// The earliest match wins: text before it is output, and a later
	// (or overlapping) stop string can only start after the first one.
	// Nothing emitted earlier can be part of a match, because a partial
	// match at the end was always held back.
	first, matched := -1, ""
	for _, s := range m.stops {
		if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
			first, matched = i, s
		}
	}
	if first >= 0 {
		m.pending, m.stopped, m.matched = "", true, matched
		return text[:first], true
	}
	hold := m.partialTail(text)
	m.pending = text[len(text)-hold:]
	return text[:len(text)-hold], false
}

// partialTail returns the length of the longest suffix of text that is a
// proper prefix of some stop string (a stop string that may still complete).
func (m *StopMatcher) partialTail(text string) int {
	best := 0
	for _, s := range m.stops {
		// Suffixes longer than len(s)-1 cannot be proper prefixes of s;
		// try the longest first and stop at the first hit.
		for n := min(len(s)-1, len(text)); n > best; n-- {
			if strings.HasPrefix(s, text[len(text)-n:]) {
				best = n
				break
			}
		}
	}
	return best
}

// Flush returns the held-back text when generation ended without a stop
// string, and empties the matcher. After a stop it returns "".
func (m *StopMatcher) Flush() string {
	p := m.pending
	m.pending = ""
	return p
}

// Stopped reports whether a stop string has been matched.
func (m *StopMatcher) Stopped() bool { return m.stopped }

// Matched is the stop string that stopped the text ("" before a stop).
func (m *StopMatcher) Matched() string { return m.matched }

// Reset prepares the matcher for a new generation with the same stops.
func (m *StopMatcher) Reset() {
	m.pending, m.stopped, m.matched = "", false, ""
}
