package sampler

import (
	"errors"
	"testing"
)

// TestHugeRepeatWindow: a window far larger than any sequence (issue 13:
// repeat_last_n 10^10 was allocated up front and killed the server) costs
// memory only for the tokens actually accepted, and still penalises them.
func TestHugeRepeatWindow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Temperature = 0
	cfg.RepeatPenalty = 100
	cfg.RepeatLastN = 1 << 40
	s, err := New(cfg, 8)
	if err != nil {
		t.Fatal(err)
	}
	logits := []float32{5, 4, 3, 2, 1, 0, -1, -2}
	for want := range 3 {
		got, err := s.Sample(logits)
		if err != nil || got != want {
			t.Fatalf("draw %d: %d, %v; want %d (the tokens drawn before are penalised)", want, got, err, want)
		}
		s.Accept(got)
	}
	if cap(s.ring) > 1024 {
		t.Errorf("ring capacity %d after 3 tokens", cap(s.ring))
	}
}

// TestSmallWindowEvicts: a window of 2 forgets the third token back.
func TestSmallWindowEvicts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Temperature = 0
	cfg.RepeatPenalty = 100
	cfg.RepeatLastN = 2
	s, err := New(cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	logits := []float32{3, 2, 1, 0}
	for _, tok := range []int{0, 1, 2} {
		s.Accept(tok)
	}
	// Token 0 left the window; 1 and 2 are penalised.
	if got, _ := s.Sample(logits); got != 0 {
		t.Errorf("got %d, want 0 (out of the window again)", got)
	}
	s.Reset()
	if got, _ := s.Sample(logits); got != 0 || len(s.ring) != 0 {
		t.Errorf("after Reset: %d with %d tokens in the window", got, len(s.ring))
	}
}

func TestValidate(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(10); err != nil {
		t.Fatal(err)
	}
	cfg.RepeatLastN = -2
	if err := cfg.Validate(10); !errors.Is(err, ErrConfig) {
		t.Errorf("Validate: %v, want ErrConfig", err)
	}
}
