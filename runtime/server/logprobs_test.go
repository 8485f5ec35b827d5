package server

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestStepLogprobs checks the vector log-probabilities against a float64
// softmax and a full sort: the token's and the top n's log-probabilities
// within 2e-6, the top n's ids exactly (equal logits in id order), NaN
// impossible, and the scratch reused.
func TestStepLogprobs(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	var scratch []float32
	for _, n := range []int{1, 7, 1000, 151936} {
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 4)
		}
		if n > 10 {
			logits[3] = float32(math.NaN())
			logits[5] = float32(math.Inf(-1))
			logits[8] = logits[9] // a tie
		}
		for _, top := range []int{0, 1, 5, 20} {
			st := stepLogprobs(logits, n-1, top, &scratch)
			var sum float64
			mx := math.Inf(-1)
			for _, l := range logits {
				if l == l {
					mx = max(mx, float64(l))
				}
			}
			for _, l := range logits {
				if l == l {
					sum += math.Exp(float64(l) - mx)
				}
			}
			logZ := mx + math.Log(sum)
			if want := float64(logits[n-1]) - logZ; math.Abs(st.logprob-want) > 2e-6 {
				t.Fatalf("n=%d: logprob %v, want %v", n, st.logprob, want)
			}
			order := make([]int, 0, n)
			for i, l := range logits {
				if l == l {
					order = append(order, i)
				}
			}
			sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
			want := order[:min(top, len(order))]
			var got []int
			for _, tp := range st.top {
				got = append(got, tp.id)
				if w := float64(logits[tp.id]) - logZ; math.Abs(tp.logprob-w) > 2e-6 {
					t.Fatalf("n=%d top=%d: token %d logprob %v, want %v", n, top, tp.id, tp.logprob, w)
				}
			}
			if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("n=%d top=%d: top %v, want %v", n, top, got, want)
			}
		}
		if n > 10 {
			if st := stepLogprobs(logits, 3, 0, &scratch); !math.IsInf(st.logprob, -1) {
				t.Errorf("n=%d: a NaN logit's logprob %v", n, st.logprob)
			}
		}
	}
	if cap(scratch) != 151936 {
		t.Errorf("scratch of %d, want the largest vocabulary's", cap(scratch))
	}
	all := []float32{float32(math.NaN()), float32(math.Inf(-1))}
	if st := stepLogprobs(all, 0, 2, &scratch); !math.IsInf(st.logprob, -1) || len(st.top) != 0 {
		t.Errorf("nothing possible: %+v", st)
	}
}

func BenchmarkStepLogprobs150k(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	l := make([]float32, 151936)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 4)
	}
	var scratch []float32
	b.ReportAllocs()
	for b.Loop() {
		stepLogprobs(l, 17, 5, &scratch)
	}
}
