package sampler

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// logitsOf returns log(p) for each p, so softmax(logits) == p.
func logitsOf(p ...float64) []float32 {
	out := make([]float32, len(p))
	for i, x := range p {
		out[i] = float32(math.Log(x))
	}
	return out
}

func mustNew(t *testing.T, cfg Config, n int) *Sampler {
	t.Helper()
	s, err := New(cfg, n)
	if err != nil {
		t.Fatalf("New(%+v, %d): %v", cfg, n, err)
	}
	return s
}

func greedy() Config { c := DefaultConfig(); c.Temperature = 0; return c }

// plain samples at temperature 1 with every filter off.
func plain() Config { return Config{Temperature: 1, TopP: 1, RepeatPenalty: 1, Seed: 42} }

// ids returns the candidate ids left after top-k/top-p/min-p, sorted.
func ids(t *testing.T, s *Sampler, logits []float32) []int {
	t.Helper()
	s.prepare(logits)
	c, err := s.candidates()
	if err != nil {
		t.Fatalf("candidates: %v", err)
	}
	var out []int
	for _, x := range c {
		out = append(out, int(x.id))
	}
	sort.Ints(out)
	return out
}

func TestGreedyPicksArgmax(t *testing.T) {
	s := mustNew(t, greedy(), 6)
	for _, tc := range []struct {
		logits []float32
		want   int
	}{
		{[]float32{0.1, 2, -1, 1.9, 0, 0}, 1},
		{[]float32{-5, -4, -3, -2, -1, -1.5}, 4},
		{[]float32{1, 3, 3, 0, 0, 0}, 1}, // ties go to the lowest id
		{[]float32{float32(math.NaN()), 0, 0, 0, 0, 1}, 5},
	} {
		for range 3 { // greedy never depends on the random stream
			got, err := s.Sample(tc.logits)
			if err != nil || got != tc.want {
				t.Errorf("Sample(%v) = %d, %v; want %d", tc.logits, got, err, tc.want)
			}
		}
	}
}

func TestSampleDoesNotModifyLogits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RepeatPenalty, cfg.LogitBias, cfg.Seed = 1.5, map[int]float32{1: -3}, 1
	s := mustNew(t, cfg, 4)
	s.Accept(0)
	l := []float32{1, 2, 3, 4}
	if _, err := s.Sample(l); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l, []float32{1, 2, 3, 4}) {
		t.Errorf("logits changed to %v", l)
	}
}

func TestTopK1EqualsGreedy(t *testing.T) {
	const n = 1000
	r := rand.New(rand.NewPCG(1, 2))
	g := mustNew(t, greedy(), n)
	cfg := plain()
	cfg.TopK = 1
	k1 := mustNew(t, cfg, n)
	logits := make([]float32, n)
	for trial := range 200 {
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * 3)
		}
		if trial%10 == 0 { // include exact ties for the top spot
			logits[7], logits[500] = 100, 100
		}
		want, err1 := g.Sample(logits)
		got, err2 := k1.Sample(logits)
		if err1 != nil || err2 != nil || got != want {
			t.Fatalf("trial %d: top-k=1 gave %d (%v), greedy %d (%v)", trial, got, err2, want, err1)
		}
	}
}

func TestTopK(t *testing.T) {
	cfg := plain()
	cfg.TopK = 3
	s := mustNew(t, cfg, 6)
	got := ids(t, s, []float32{0.5, 3, -1, 2, 2.5, 0})
	if want := []int{1, 3, 4}; !slices.Equal(got, want) {
		t.Errorf("top-3 = %v, want %v", got, want)
	}
	// Fewer than k allowed tokens: the banned ones are not candidates.
	got = ids(t, s, []float32{negInf, 1, negInf, negInf, 2, negInf})
	if want := []int{1, 4}; !slices.Equal(got, want) {
		t.Errorf("top-3 with bans = %v, want %v", got, want)
	}
}

func TestTopPKeepsMinimalNucleus(t *testing.T) {
	probs := []float64{0.05, 0.5, 0.15, 0.3} // sorted: 1 (.5), 3 (.3), 2 (.15), 0 (.05)
	for _, tc := range []struct {
		p    float32
		want []int
	}{
		{0.45, []int{1}},          // the top token alone reaches 0.45
		{0.75, []int{1, 3}},       // 0.5 < 0.75 <= 0.8
		{0.85, []int{1, 2, 3}},    // 0.8 < 0.85 <= 0.95
		{0.97, []int{0, 1, 2, 3}}, // needs everything
		{1, []int{0, 1, 2, 3}},    // off
	} {
		for _, topK := range []int{0, 3} { // unsorted path and, with k < n, the sorted one
			cfg := plain()
			cfg.TopP, cfg.TopK = tc.p, topK
			s := mustNew(t, cfg, len(probs))
			want := tc.want
			if topK == 3 { // top-k=3 first drops token 0
				want = slices.DeleteFunc(slices.Clone(want), func(i int) bool { return i == 0 })
			}
			if got := ids(t, s, logitsOf(probs...)); !slices.Equal(got, want) {
				t.Errorf("top_p=%v top_k=%d: kept %v, want %v", tc.p, topK, got, want)
			}
		}
	}
}

// TestTopPLargeVocab checks the select-then-grow path of top-p against a
// full sort on vocabularies where the nucleus is small, medium and nearly
// everything.
func TestTopPLargeVocab(t *testing.T) {
	const n = 50000
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, n)
	for _, scale := range []float64{8, 5, 3.5, 2, 0.01} { // peaked … flat
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * scale)
		}
		const p = 0.9
		// Reference: sort everything, softmax, shortest prefix >= p.
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
		var sum float64
		for _, l := range logits {
			sum += math.Exp(float64(l - logits[order[0]]))
		}
		var cum float64
		var want []int
		for _, i := range order {
			cum += math.Exp(float64(logits[i]-logits[order[0]])) / sum
			want = append(want, i)
			if cum >= p {
				break
			}
		}
		sort.Ints(want)

		cfg := plain()
		cfg.TopP = p
		s := mustNew(t, cfg, n)
		got := ids(t, s, logits)
		// float32 vs float64 rounding may move the cut by one token when
		// the crossing is razor thin; anything more is a bug.
		short, long := got, want
		if len(short) > len(long) {
			short, long = long, short
		}
		if len(long)-len(short) > 1 {
			t.Fatalf("scale %v: nucleus has %d tokens, reference %d", scale, len(got), len(want))
		}
		for _, id := range short {
			if _, ok := slices.BinarySearch(long, id); !ok {
				t.Fatalf("scale %v: token %d is in one nucleus but not the other", scale, id)
			}
		}
		t.Logf("scale %v: nucleus %d tokens", scale, len(got))
	}
}

// TestWholeVocabFilters checks top-p and min-p over the whole vocabulary
// (no top-k: the vector paths, topPAll and aboveLogit) against the plain
// algorithm, a candidate per token, with tokens banned by a mask among
// the most likely ones: min-p keeps exactly the same tokens, top-p the
// same nucleus up to a token at the cut (float rounding), and no banned
// token is ever kept.
func TestWholeVocabFilters(t *testing.T) {
	const n = 151936
	r := rand.New(rand.NewPCG(13, 14))
	logits := make([]float32, n)
	allowed := make([]uint64, (n+63)/64)
	for _, scale := range []float64{8, 3, 0.5} {
		for i := range logits {
			logits[i] = float32(r.NormFloat64() * scale)
		}
		for w := range allowed {
			allowed[w] = ^uint64(0)
		}
		banned := map[int]bool{}
		order := make([]int, n)
		for i := range order {
			order[i] = i
		}
		sort.Slice(order, func(a, b int) bool { return logits[order[a]] > logits[order[b]] })
		for _, i := range order[:50:50] {
			if r.IntN(2) == 0 {
				banned[i] = true
				allowed[i/64] &^= 1 << (i % 64)
			}
		}
		for _, tc := range []struct{ topP, minP float32 }{{0.9, 0}, {0.5, 0}, {1, 0.05}, {1, 1e-6}, {0.95, 0.05}} {
			cfg := plain()
			cfg.TopP, cfg.MinP = tc.topP, tc.minP
			s := mustNew(t, cfg, n)
			s.prepare(logits)
			s.mask(allowed)
			c, err := s.candidates()
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, x := range c {
				if banned[int(x.id)] {
					t.Fatalf("scale %v %+v: banned token %d kept", scale, tc, x.id)
				}
				got = append(got, int(x.id))
			}
			sort.Ints(got)
			// The plain algorithm: every allowed token sorted, the float64
			// softmax's shortest prefix reaching top-p, then min-p.
			var all []cand
			for i, l := range s.work {
				if !math.IsInf(float64(l), -1) {
					all = append(all, cand{id: int32(i), logit: l})
				}
			}
			slices.SortStableFunc(all, cmpCand)
			if tc.topP < 1 {
				var sum, cum float64
				for _, x := range all {
					sum += math.Exp(float64(x.logit - all[0].logit))
				}
				for i, x := range all {
					if cum += math.Exp(float64(x.logit-all[0].logit)) / sum; cum >= float64(tc.topP) {
						all = all[:i+1]
						break
					}
				}
			}
			if tc.minP > 0 {
				all = minP(all, tc.minP, true)
			}
			var want []int
			for _, x := range all {
				want = append(want, int(x.id))
			}
			sort.Ints(want)
			if tc.topP == 1 {
				if !slices.Equal(got, want) {
					t.Fatalf("scale %v %+v: kept %d tokens, the plain path %d", scale, tc, len(got), len(want))
				}
				continue
			}
			short, long := got, want
			if len(short) > len(long) {
				short, long = long, short
			}
			if len(long)-len(short) > 1 {
				t.Fatalf("scale %v %+v: nucleus of %d tokens, the plain path %d", scale, tc, len(got), len(want))
			}
			for _, id := range short {
				if _, ok := slices.BinarySearch(long, id); !ok {
					t.Fatalf("scale %v %+v: token %d in one nucleus only", scale, tc, id)
				}
			}
		}
	}
	// Everything banned: no candidate, an error, not a banned token.
	s := mustNew(t, Config{Temperature: 1, TopP: 0.9, RepeatPenalty: 1, Seed: 1}, n)
	if _, err := s.SampleMasked(logits, make([]uint64, (n+63)/64)); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("top-p with every token banned: %v", err)
	}
	s = mustNew(t, Config{Temperature: 1, TopP: 1, MinP: 0.1, RepeatPenalty: 1, Seed: 1}, n)
	if _, err := s.SampleMasked(logits, make([]uint64, (n+63)/64)); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("min-p with every token banned: %v", err)
	}
}

// TestDrawAllMatchesDraw checks the unfiltered draw over the whole
// vocabulary (drawAll) against draw over the plain candidate list, seed
// for seed: the same tokens but for draws within float rounding of a
// boundary, never a banned token, and no random number spent when one
// token is allowed (as draw).
func TestDrawAllMatchesDraw(t *testing.T) {
	const n, draws = 3000, 4000
	r := rand.New(rand.NewPCG(15, 16))
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(r.NormFloat64() * 2)
	}
	allowed := make([]uint64, (n+63)/64)
	for w := range allowed {
		allowed[w] = ^uint64(0)
	}
	for i := 0; i < n; i += 3 {
		allowed[i/64] &^= 1 << (i % 64)
	}
	cfg := Config{Temperature: 0.7, TopP: 1, RepeatPenalty: 1, Seed: 77}
	a, b := mustNew(t, cfg, n), mustNew(t, cfg, n)
	if !a.unfiltered() {
		t.Fatal("the config does not take drawAll")
	}
	differ := 0
	for range draws {
		got, err := a.SampleMasked(logits, allowed)
		if err != nil {
			t.Fatal(err)
		}
		if got%3 == 0 {
			t.Fatalf("banned token %d drawn", got)
		}
		b.prepare(logits)
		b.mask(allowed)
		var c []cand
		for i, l := range b.work {
			if !math.IsInf(float64(l), -1) {
				c = append(c, cand{id: int32(i), logit: l})
			}
		}
		if want := b.draw(c); got != want {
			differ++
		}
	}
	if differ > draws/1000 {
		t.Errorf("%d of %d draws differ from draw's", differ, draws)
	}
	// One allowed token: drawn without a random number, so the next
	// draws of both samplers stay in step.
	one := make([]uint64, (n+63)/64)
	one[0] = 1 << 5
	for _, s := range []*Sampler{a, b} {
		s.Reset()
	}
	if got, err := a.SampleMasked(logits, one); err != nil || got != 5 {
		t.Fatalf("one token allowed: %d, %v", got, err)
	}
	x, _ := a.SampleMasked(logits, allowed)
	y, _ := b.SampleMasked(logits, allowed)
	if x != y {
		t.Errorf("after a forced token the streams differ: %d, %d", x, y)
	}
	if _, err := a.SampleMasked(logits, make([]uint64, (n+63)/64)); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("every token banned: %v", err)
	}
}

func TestMinP(t *testing.T) {
	probs := []float64{0.05, 0.5, 0.15, 0.3}
	for _, tc := range []struct {
		minP float32
		want []int
	}{
		{0.2, []int{1, 2, 3}}, // threshold 0.1 drops 0.05
		{0.5, []int{1, 3}},    // threshold 0.25
		{0.7, []int{1}},       // threshold 0.35
		{0.09, []int{0, 1, 2, 3}},
		{1, []int{1}},
	} {
		for _, topK := range []int{0, 3} {
			cfg := plain()
			cfg.MinP, cfg.TopK = tc.minP, topK
			s := mustNew(t, cfg, len(probs))
			want := tc.want
			if topK == 3 {
				want = slices.DeleteFunc(slices.Clone(want), func(i int) bool { return i == 0 })
			}
			if got := ids(t, s, logitsOf(probs...)); !slices.Equal(got, want) {
				t.Errorf("min_p=%v top_k=%d: kept %v, want %v", tc.minP, topK, got, want)
			}
		}
	}
}

func TestPenaltiesArithmetic(t *testing.T) {
	cfg := greedy()
	cfg.RepeatPenalty, cfg.FrequencyPenalty, cfg.PresencePenalty, cfg.RepeatLastN = 2, 0.5, 0.25, 64
	s := mustNew(t, cfg, 6)
	for _, tok := range []int{0, 1, 0, 3, 5, 5, 5, -1, 99} { // -1 and 99 are ignored
		s.Accept(tok)
	}
	logits := []float32{2, -2, 1, 0.5, 3, 0}
	s.prepare(logits)
	want := []float32{
		2/2.0 - 2*0.5 - 0.25,  // positive: divided; seen twice
		-2*2.0 - 1*0.5 - 0.25, // negative: multiplied
		1,                     // never seen
		0.5/2 - 0.5 - 0.25,
		3,
		0*2 - 3*0.5 - 0.25, // zero stays zero under the repeat penalty
	}
	if !slices.Equal(s.work, want) {
		t.Errorf("penalised logits %v, want %v", s.work, want)
	}
	if got, _ := s.Sample(logits); got != 4 {
		t.Errorf("greedy after penalties = %d, want 4", got)
	}

	s.Reset()
	s.prepare(logits)
	if !slices.Equal(s.work, logits) {
		t.Errorf("after Reset the logits are still penalised: %v", s.work)
	}
}

func TestPenaltyWindow(t *testing.T) {
	cfg := greedy()
	cfg.PresencePenalty, cfg.RepeatLastN = 1, 2
	s := mustNew(t, cfg, 4)
	for _, tok := range []int{0, 1, 2, 2} { // window keeps the last two: 2, 2
		s.Accept(tok)
	}
	s.prepare(make([]float32, 4))
	if want := []float32{0, 0, -1, 0}; !slices.Equal(s.work, want) {
		t.Errorf("window 2: %v, want %v", s.work, want)
	}
	s.Accept(3) // window: 2, 3
	s.prepare(make([]float32, 4))
	if want := []float32{0, 0, -1, -1}; !slices.Equal(s.work, want) {
		t.Errorf("window 2 after one more: %v, want %v", s.work, want)
	}

	cfg.RepeatLastN, cfg.FrequencyPenalty = -1, 1 // -1: everything since Reset
	s = mustNew(t, cfg, 4)
	for _, tok := range []int{0, 1, 2, 2, 3, 3, 3} {
		s.Accept(tok)
	}
	s.prepare(make([]float32, 4))
	if want := []float32{-2, -2, -3, -4}; !slices.Equal(s.work, want) {
		t.Errorf("unbounded window: %v, want %v", s.work, want)
	}

	cfg.RepeatLastN = 0 // off, whatever the penalties say
	s = mustNew(t, cfg, 4)
	s.Accept(1)
	s.prepare(make([]float32, 4))
	if want := make([]float32, 4); !slices.Equal(s.work, want) {
		t.Errorf("repeat_last_n=0: %v, want no penalty", s.work)
	}
}

func TestLogitBias(t *testing.T) {
	cfg := greedy()
	cfg.LogitBias = map[int]float32{2: negInf, 0: 1.5}
	s := mustNew(t, cfg, 4)
	if got, _ := s.Sample([]float32{0, 1, 9, 0.9}); got != 0 { // 2 banned, 0 lifted to 1.5
		t.Errorf("greedy with bias = %d, want 0", got)
	}

	cfg = plain()
	cfg.LogitBias = map[int]float32{1: negInf}
	s = mustNew(t, cfg, 3)
	counts := make([]int, 3)
	for range 5000 {
		tok, err := s.Sample([]float32{0, 5, 0})
		if err != nil {
			t.Fatal(err)
		}
		counts[tok]++
	}
	if counts[1] != 0 || counts[0] == 0 || counts[2] == 0 {
		t.Errorf("banned token drawn: counts %v", counts)
	}

	for _, c := range []Config{greedy(), plain()} {
		c.LogitBias = map[int]float32{0: negInf, 1: negInf}
		s = mustNew(t, c, 2)
		if _, err := s.Sample([]float32{1, 2}); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("temperature %v, all banned: err %v, want ErrNoCandidates", c.Temperature, err)
		}
	}
}

func draws(t *testing.T, s *Sampler, logits []float32, n int) []int {
	t.Helper()
	out := make([]int, n)
	for i := range out {
		tok, err := s.Sample(logits)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = tok
	}
	return out
}

func TestSeedDeterminism(t *testing.T) {
	logits := logitsOf(0.1, 0.2, 0.3, 0.25, 0.15)
	cfg := DefaultConfig()
	cfg.Temperature, cfg.Seed = 1.3, 1234
	a := draws(t, mustNew(t, cfg, 5), logits, 300)
	b := draws(t, mustNew(t, cfg, 5), logits, 300)
	if !slices.Equal(a, b) {
		t.Error("same seed gave different sequences")
	}
	cfg.Seed = 1235
	if c := draws(t, mustNew(t, cfg, 5), logits, 300); slices.Equal(a, c) {
		t.Error("seeds 1234 and 1235 gave the same 300 draws")
	}

	// Reset rewinds the stream.
	cfg.Seed = 1234
	s := mustNew(t, cfg, 5)
	draws(t, s, logits, 17)
	s.Reset()
	if again := draws(t, s, logits, 300); !slices.Equal(a, again) {
		t.Error("after Reset the sampler did not repeat its draws")
	}

	// Unset seed: random, reported, and reusable to repeat the run.
	cfg.Seed = 0
	r1, r2 := mustNew(t, cfg, 5), mustNew(t, cfg, 5)
	if r1.Seed() == 0 || r1.Seed() == r2.Seed() {
		t.Errorf("unset seeds: got %d and %d, want two different non-zero seeds", r1.Seed(), r2.Seed())
	}
	first := draws(t, r1, logits, 300)
	cfg.Seed = r1.Seed()
	if rep := draws(t, mustNew(t, cfg, 5), logits, 300); !slices.Equal(first, rep) {
		t.Error("re-running with the reported seed gave a different sequence")
	}
}

// chiSquare returns Pearson's statistic for observed counts against probs.
func chiSquare(counts []int, probs []float64) float64 {
	total := 0
	for _, c := range counts {
		total += c
	}
	var x float64
	for i, c := range counts {
		e := probs[i] * float64(total)
		x += (float64(c) - e) * (float64(c) - e) / e
	}
	return x
}

func TestDistribution(t *testing.T) {
	// Critical value of chi-square with 3 degrees of freedom at p = 0.001.
	// With a fixed seed the test is deterministic; the bound only says the
	// sampler's frequencies are what softmax(logits/T) predicts.
	const crit, n = 16.27, 20000
	probs := []float64{0.1, 0.2, 0.3, 0.4}
	for _, tc := range []struct {
		temp float32
		want []float64
	}{
		{1, probs},
		{2, normalise(probs, 0.5)}, // softmax(log p / 2) ∝ p^0.5
		{0.5, normalise(probs, 2)},
	} {
		cfg := plain()
		cfg.Temperature, cfg.Seed = tc.temp, 7
		s := mustNew(t, cfg, 4)
		counts := make([]int, 4)
		for _, tok := range draws(t, s, logitsOf(probs...), n) {
			counts[tok]++
		}
		if x := chiSquare(counts, tc.want); x > crit {
			t.Errorf("T=%v: counts %v vs probs %v: chi-square %.2f > %.2f", tc.temp, counts, tc.want, x, crit)
		} else {
			t.Logf("T=%v: counts %v, chi-square %.2f", tc.temp, counts, x)
		}
	}
}

func normalise(p []float64, pow float64) []float64 {
	out := make([]float64, len(p))
	var sum float64
	for i, x := range p {
		out[i] = math.Pow(x, pow)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func TestInvalidConfigs(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		n     int
		field string
	}{
		{"negative temperature", func(c *Config) { c.Temperature = -0.1 }, 10, "temperature"},
		{"NaN temperature", func(c *Config) { c.Temperature = nan }, 10, "temperature"},
		{"negative top_k", func(c *Config) { c.TopK = -1 }, 10, "top_k"},
		{"top_p 0", func(c *Config) { c.TopP = 0 }, 10, "top_p"},
		{"top_p above 1", func(c *Config) { c.TopP = 1.01 }, 10, "top_p"},
		{"top_p NaN", func(c *Config) { c.TopP = nan }, 10, "top_p"},
		{"min_p negative", func(c *Config) { c.MinP = -0.01 }, 10, "min_p"},
		{"min_p above 1", func(c *Config) { c.MinP = 2 }, 10, "min_p"},
		{"repeat_penalty 0", func(c *Config) { c.RepeatPenalty = 0 }, 10, "repeat_penalty"},
		{"repeat_penalty Inf", func(c *Config) { c.RepeatPenalty = float32(math.Inf(1)) }, 10, "repeat_penalty"},
		{"repeat_last_n -2", func(c *Config) { c.RepeatLastN = -2 }, 10, "repeat_last_n"},
		{"presence NaN", func(c *Config) { c.PresencePenalty = nan }, 10, "presence_penalty"},
		{"frequency Inf", func(c *Config) { c.FrequencyPenalty = float32(math.Inf(-1)) }, 10, "frequency_penalty"},
		{"bias id too big", func(c *Config) { c.LogitBias = map[int]float32{10: 1} }, 10, "logit_bias"},
		{"bias id negative", func(c *Config) { c.LogitBias = map[int]float32{-1: 1} }, 10, "logit_bias"},
		{"bias +Inf", func(c *Config) { c.LogitBias = map[int]float32{1: float32(math.Inf(1))} }, 10, "logit_bias"},
		{"bias NaN", func(c *Config) { c.LogitBias = map[int]float32{1: nan} }, 10, "logit_bias"},
		{"empty vocabulary", func(c *Config) {}, 0, "vocabulary"},
		{"zero Config", func(c *Config) { *c = Config{} }, 10, "top_p"},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		_, err := New(cfg, tc.n)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want ErrConfig naming %s", tc.name, err, tc.field)
		}
	}
	// Edges that are valid.
	for _, edit := range []func(*Config){
		func(c *Config) { c.TopP, c.MinP = 1, 1 },
		func(c *Config) { c.TopK = 1000 }, // larger than the vocabulary: no-op
		func(c *Config) { c.RepeatLastN = -1 },
		func(c *Config) { c.PresencePenalty, c.FrequencyPenalty = -2, -2 },
		func(c *Config) { c.LogitBias = map[int]float32{9: negInf} },
	} {
		cfg := DefaultConfig()
		edit(&cfg)
		if _, err := New(cfg, 10); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

func TestNonFiniteLogits(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, topK := range []int{0, 2} {
		cfg := plain()
		cfg.TopK = topK
		s := mustNew(t, cfg, 4)
		for range 200 {
			// NaN is never drawn; +Inf dominates (it is clamped to the
			// largest float, so the softmax stays defined).
			if tok, err := s.Sample([]float32{nan, 1, inf, nan}); err != nil || tok != 2 {
				t.Fatalf("top_k=%d: Sample = %d, %v; want 2", topK, tok, err)
			}
		}
		if _, err := s.Sample([]float32{nan, nan, negInf, nan}); !errors.Is(err, ErrNoCandidates) {
			t.Errorf("top_k=%d: all NaN/-Inf: err %v, want ErrNoCandidates", topK, err)
		}
	}
}

func TestWrongLogitCount(t *testing.T) {
	s := mustNew(t, DefaultConfig(), 4)
	if _, err := s.Sample(make([]float32, 3)); err == nil {
		t.Error("Sample accepted 3 logits for a vocabulary of 4")
	}
}

func bigLogits(n int) []float32 {
	r := rand.New(rand.NewPCG(5, 6))
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 4)
	}
	return l
}

func TestSampleDoesNotAllocate(t *testing.T) {
	const n = 150000
	logits := bigLogits(n)
	for name, edit := range map[string]func(*Config){
		"default": func(c *Config) {},
		"greedy":  func(c *Config) { c.Temperature = 0 },
		"no top-k": func(c *Config) {
			c.TopK = 0
		},
		"min-p alone": func(c *Config) { c.TopK, c.TopP = 0, 1 },
		"no filter":   func(c *Config) { c.TopK, c.TopP, c.MinP = 0, 1, 0 },
		"penalties": func(c *Config) {
			c.RepeatPenalty, c.FrequencyPenalty, c.PresencePenalty = 1.1, 0.2, 0.1
		},
	} {
		cfg := DefaultConfig()
		cfg.Seed = 9
		edit(&cfg)
		s := mustNew(t, cfg, n)
		for i := range 100 {
			s.Accept(i * 31)
		}
		allocs := testing.AllocsPerRun(20, func() {
			tok, err := s.Sample(logits)
			if err != nil {
				t.Fatal(err)
			}
			s.Accept(tok)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Sample+Accept, want 0", name, allocs)
		}
	}
}

func benchSample(b *testing.B, edit func(*Config)) {
	const n = 151936 // Qwen3's vocabulary
	logits := bigLogits(n)
	cfg := DefaultConfig()
	cfg.Seed = 1
	edit(&cfg)
	s, err := New(cfg, n)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sample(logits); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSampleDefault150k(b *testing.B) { benchSample(b, func(*Config) {}) }
func BenchmarkSampleGreedy150k(b *testing.B)  { benchSample(b, func(c *Config) { c.Temperature = 0 }) }
func BenchmarkSampleNoTopK150k(b *testing.B)  { benchSample(b, func(c *Config) { c.TopK = 0 }) }

// BenchmarkSampleGreedyMasked150k: a greedy draw with a mask that leaves
// out a few tokens (a server's ignore_eos).
func BenchmarkSampleGreedyMasked150k(b *testing.B) {
	const n = 151936
	logits := bigLogits(n)
	cfg := DefaultConfig()
	cfg.Temperature, cfg.RepeatPenalty = 0, 1
	s, err := New(cfg, n)
	if err != nil {
		b.Fatal(err)
	}
	allowed := make([]uint64, (n+63)/64)
	for w := range allowed {
		allowed[w] = ^uint64(0)
	}
	for _, id := range []int{151643, 151645} {
		allowed[id/64] &^= 1 << (id % 64)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.SampleMasked(logits, allowed); err != nil {
			b.Fatal(err)
		}
	}
}
func BenchmarkSampleNoTopKNoMinP150k(b *testing.B) {
	benchSample(b, func(c *Config) { c.TopK, c.MinP = 0, 0 })
}

// BenchmarkSampleMinPOnly150k: min-p alone (top-k and top-p off).
func BenchmarkSampleMinPOnly150k(b *testing.B) {
	benchSample(b, func(c *Config) { c.TopK, c.TopP = 0, 1 })
}

func TestSampleMasked(t *testing.T) {
	const n = 200 // more than one mask word, the last one partial
	rng := rand.New(rand.NewPCG(9, 9))
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	logits[7] = 50 // the favourite, never allowed below
	allowed := make([]uint64, (n+63)/64)
	allowedSet := map[int]bool{}
	for _, id := range []int{3, 64, 65, 130, 199} {
		allowed[id/64] |= 1 << (id % 64)
		allowedSet[id] = true
	}
	best := 3
	for id := range allowedSet {
		if logits[id] > logits[best] {
			best = id
		}
	}
	g := mustNew(t, greedy(), n)
	if got, err := g.SampleMasked(logits, allowed); err != nil || got != best {
		t.Errorf("greedy SampleMasked = %d, %v; want %d", got, err, best)
	}
	for _, cfg := range []Config{plain(), DefaultConfig()} {
		s := mustNew(t, cfg, n)
		for range 500 {
			got, err := s.SampleMasked(logits, allowed)
			if err != nil {
				t.Fatal(err)
			}
			if !allowedSet[got] {
				t.Fatalf("%+v: drew %d, not allowed", cfg, got)
			}
		}
	}
	// A nil mask is Sample; an empty one leaves nothing; a short one is
	// an error.
	if got, _ := g.SampleMasked(logits, nil); got != 7 {
		t.Errorf("nil mask drew %d, want 7", got)
	}
	if _, err := g.SampleMasked(logits, make([]uint64, len(allowed))); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("empty mask: %v, want ErrNoCandidates", err)
	}
	if _, err := g.SampleMasked(logits, allowed[:1]); err == nil {
		t.Error("short mask accepted")
	}
}

// scalarArgmax is the plain loop the vector draws must match: the first
// of the largest, ErrNoCandidates when that is -Inf.
func scalarArgmax(w []float32) (int, error) {
	best := 0
	for i, l := range w {
		if l > w[best] {
			best = i
		}
	}
	if math.IsInf(float64(w[best]), -1) {
		return 0, ErrNoCandidates
	}
	return best, nil
}

// The greedy fast path draws what prepare, mask and argmax give, with
// NaN, -Inf, ties and masks of every word shape, and says so when nothing
// is allowed.
func TestGreedyArgmaxMatchesPrepared(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 63, 64, 65, 1000, 151936} {
		cfg := DefaultConfig()
		cfg.Temperature, cfg.RepeatPenalty = 0, 1
		s, err := New(cfg, n)
		if err != nil {
			t.Fatal(err)
		}
		if !s.plainGreedy() {
			t.Fatal("temperature 0 without penalties or bias should take the fast path")
		}
		for trial := range 20 {
			logits := make([]float32, n)
			for i := range logits {
				switch r := rng.IntN(100); {
				case r < 3:
					logits[i] = float32(math.NaN())
				case r < 6:
					logits[i] = float32(math.Inf(-1))
				case r < 20:
					logits[i] = 1 // ties
				default:
					logits[i] = float32(rng.NormFloat64())
				}
			}
			var allowed []uint64
			switch trial % 3 {
			case 1:
				allowed = make([]uint64, (n+63)/64)
				for w := range allowed {
					switch rng.IntN(3) {
					case 0:
					case 1:
						allowed[w] = ^uint64(0)
					default:
						allowed[w] = rng.Uint64()
					}
				}
			case 2: // all but a few, as ignore_eos: long runs of whole words
				allowed = make([]uint64, (n+63)/64)
				for w := range allowed {
					allowed[w] = ^uint64(0)
				}
				for range 1 + n/20000 {
					id := rng.IntN(n)
					allowed[id/64] &^= 1 << (id % 64)
				}
			}
			got, gotErr := greedyArgmax(logits, allowed)
			s.prepare(logits)
			if allowed != nil {
				s.mask(allowed)
			}
			if a, aErr := s.argmax(); (aErr != nil) != (gotErr != nil) || aErr == nil && a != got {
				t.Fatalf("n=%d trial %d: argmax %d (%v), fast path %d (%v)", n, trial, a, aErr, got, gotErr)
			}
			want, wantErr := scalarArgmax(s.work)
			if (gotErr != nil) != (wantErr != nil) || gotErr == nil && got != want {
				t.Fatalf("n=%d trial %d: fast path %d (%v), prepared %d (%v)", n, trial, got, gotErr, want, wantErr)
			}
		}
	}
	if _, err := greedyArgmax([]float32{1, 2}, []uint64{0}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("nothing allowed: %v, want ErrNoCandidates", err)
	}
}

// firstMax across its blocks: the first of equal maxima in different
// blocks, a maximum in the last partial block, +Inf, and nothing but NaN
// and -Inf.
func TestFirstMaxBlocks(t *testing.T) {
	n := 3*argmaxBlock + 17
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	x[2*argmaxBlock+5], x[argmaxBlock+9] = 50, 50
	if got, _ := firstMax(x); got != argmaxBlock+9 {
		t.Errorf("equal maxima: %d, want %d", got, argmaxBlock+9)
	}
	x[n-1] = 51
	if got, _ := firstMax(x); got != n-1 {
		t.Errorf("maximum in the tail: %d, want %d", got, n-1)
	}
	x[7] = float32(math.Inf(1))
	if got, _ := firstMax(x); got != 7 {
		t.Errorf("+Inf: %d, want 7", got)
	}
	for i := range x {
		x[i] = float32(math.Inf(-1))
		if i%3 == 0 {
			x[i] = float32(math.NaN())
		}
	}
	if _, err := firstMax(x); !errors.Is(err, ErrNoCandidates) {
		t.Errorf("NaN and -Inf only: %v, want ErrNoCandidates", err)
	}
}

// BenchmarkSampleNoFilter150k: temperature alone (top-k, top-p and min-p
// off): a draw over the whole vocabulary.
func BenchmarkSampleNoFilter150k(b *testing.B) {
	benchSample(b, func(c *Config) { c.TopK, c.TopP, c.MinP = 0, 1, 0 })
}
