// Package sampler turns a step's logits into the next token, the way
// llama.cpp's default sampler chain does, and finds stop strings in the
// streamed text (see StopMatcher).
//
// The chain, in order:
//
//	penalties → logit bias → top-k → top-p → min-p → temperature → draw
//
// (llama.cpp itself applies the logit bias before the penalties; ats puts
// the bias last so a ban or boost is exactly what the caller asked for.)
//
// SampleMasked adds a step after the bias: the tokens a constraint (a
// grammar) forbids are banned, so the filters and the draw see only the
// allowed ones.
//
// With Temperature 0 the draw is greedy (the arg max after penalties and
// bias); top-k, top-p and min-p always keep the most likely token, so they
// cannot change that answer and are skipped.
package sampler

import (
	"errors"
	"fmt"
	"github.com/atsinfer/ats/ops"
	"math"
	"math/rand/v2"
	"slices"
)

// ErrConfig is wrapped by every error New returns for a bad Config, so
// callers (the HTTP server) can tell a bad request from an internal failure.
var ErrConfig = errors.New("invalid sampler config")

// ErrNoCandidates is returned by Sample when every token is banned (logit
// -Inf or NaN after penalties and bias), so nothing can be drawn.
var ErrNoCandidates = errors.New("sampler: no token left to sample (all logits are -Inf)")

// Config selects the sampling steps. The zero value is not valid (TopP
// must be in (0, 1] and RepeatPenalty > 0); start from DefaultConfig.
type Config struct {
	// Temperature divides the logits before the draw; 0 means greedy.
	Temperature float32
	// TopK keeps the K most likely tokens; 0 turns it off.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// (at temperature 1, as llama.cpp does) reaches TopP; 1 turns it off.
	TopP float32
	// MinP drops tokens less likely than MinP times the most likely one;
	// 0 turns it off.
	MinP float32

	// RepeatPenalty (llama.cpp): a token seen in the window has a positive
	// logit divided by it and a negative one multiplied by it; 1 is off.
	RepeatPenalty float32
	// RepeatLastN is the window, in accepted tokens, that all three
	// penalties look at: 0 turns the penalties off, -1 means every token
	// accepted since New or Reset (llama.cpp's meaning).
	RepeatLastN int
	// PresencePenalty and FrequencyPenalty (OpenAI): a token seen count>0
	// times in the window gets logit -= FrequencyPenalty*count +
	// PresencePenalty. 0 is off; negative values encourage repetition.
	PresencePenalty  float32
	FrequencyPenalty float32

	// LogitBias is added to the logits of the given token ids;
	// float32(math.Inf(-1)) bans a token.
	LogitBias map[int]float32

	// Seed makes the draws reproducible: the same seed, config and logits
	// give the same tokens. 0 means pick a random seed; Sampler.Seed
	// reports the one in use so a run can be repeated.
	Seed uint64
}

// DefaultConfig returns llama.cpp's defaults (llama-cli without flags).
func DefaultConfig() Config {
	return Config{
		Temperature:   0.8,
		TopK:          40,
		TopP:          0.95,
		MinP:          0.05,
		RepeatPenalty: 1,
		RepeatLastN:   64,
	}
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// Validate reports the first thing wrong with cfg for a vocabulary of n
// (an error wrapping ErrConfig), as New would, without allocating a
// sampler.
func (cfg Config) Validate(n int) error { return cfg.validate(n) }

// validate reports the first thing wrong with cfg for a vocabulary of n.
func (cfg *Config) validate(n int) error {
	switch {
	case n <= 0 || n > math.MaxInt32:
		return fmt.Errorf("%w: vocabulary size %d outside [1, %d]", ErrConfig, n, math.MaxInt32)
	case !finite(cfg.Temperature) || cfg.Temperature < 0:
		return fmt.Errorf("%w: temperature %v must be finite and >= 0", ErrConfig, cfg.Temperature)
	case cfg.TopK < 0:
		return fmt.Errorf("%w: top_k %d must be >= 0 (0 turns it off)", ErrConfig, cfg.TopK)
	case !(cfg.TopP > 0 && cfg.TopP <= 1): // also catches NaN
		return fmt.Errorf("%w: top_p %v outside (0, 1] (1 turns it off)", ErrConfig, cfg.TopP)
	case !(cfg.MinP >= 0 && cfg.MinP <= 1):
		return fmt.Errorf("%w: min_p %v outside [0, 1] (0 turns it off)", ErrConfig, cfg.MinP)
	case !finite(cfg.RepeatPenalty) || cfg.RepeatPenalty <= 0:
		return fmt.Errorf("%w: repeat_penalty %v must be finite and > 0 (1 turns it off)", ErrConfig, cfg.RepeatPenalty)
	case cfg.RepeatLastN < -1:
		return fmt.Errorf("%w: repeat_last_n %d must be >= -1 (-1 = all, 0 = off)", ErrConfig, cfg.RepeatLastN)
	case !finite(cfg.PresencePenalty):
		return fmt.Errorf("%w: presence_penalty %v must be finite", ErrConfig, cfg.PresencePenalty)
	case !finite(cfg.FrequencyPenalty):
		return fmt.Errorf("%w: frequency_penalty %v must be finite", ErrConfig, cfg.FrequencyPenalty)
	}
	for id, b := range cfg.LogitBias {
		if id < 0 || id >= n {
			return fmt.Errorf("%w: logit_bias token %d outside the vocabulary [0, %d)", ErrConfig, id, n)
		}
		// -Inf bans; +Inf would turn the softmax into NaN, and NaN is a bug.
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
			return fmt.Errorf("%w: logit_bias for token %d is %v (use -Inf to ban, finite otherwise)", ErrConfig, id, b)
		}
	}
	return nil
}

// cand is one candidate token. p holds an unnormalised probability once a
// step has computed it.
type cand struct {
	id    int32
	logit float32
	p     float32
}

// better orders candidates most likely first; ties go to the lower id so
// results do not depend on scan order.
func better(a, b cand) bool {
	return a.logit > b.logit || (a.logit == b.logit && a.id < b.id)
}

func cmpCand(a, b cand) int {
	switch {
	case better(a, b):
		return -1
	case better(b, a):
		return 1
	}
	return 0
}

// Sampler draws tokens for one sequence. It is not safe for concurrent use.
type Sampler struct {
	cfg  Config
	n    int
	seed uint64
	pcg  *rand.PCG
	rng  *rand.Rand

	// Reused per Sample, so a draw allocates nothing.
	work  []float32 // the logits after penalties and bias
	cands []cand
	tmp   []cand
	probs []float32 // exp(work - max) over the whole vocabulary: topPAll, drawAll

	biasID  []int32 // LogitBias as sorted slices: cheap, ordered to iterate
	biasVal []float32

	// Penalty window. counts[t] is how often t occurs in it; distinct lists
	// the tokens with counts > 0 (pos[t] is t's index there) so applying the
	// penalties costs O(distinct tokens), not O(vocabulary).
	penalize bool
	// ring holds the last RepeatLastN accepted tokens (unused for -1). It
	// grows as tokens arrive, so memory follows the tokens seen, never
	// the window asked for (a window of 10^10 must not allocate 40 GB).
	ring     []int32
	ringHead int
	counts   []int32
	distinct []int32
	pos      []int32
}

// New checks cfg and returns a sampler for logits of nVocab entries.
func New(cfg Config, nVocab int) (*Sampler, error) {
	if err := cfg.validate(nVocab); err != nil {
		return nil, err
	}
	s := &Sampler{cfg: cfg, n: nVocab, seed: cfg.Seed}
	for s.seed == 0 { // 0 is "unset", so the seed we report must not be 0
		s.seed = rand.Uint64()
	}
	s.pcg = rand.NewPCG(s.seed, pcgStream)
	s.rng = rand.New(s.pcg)

	s.work = make([]float32, nVocab)
	s.cands = make([]cand, 0, nVocab)
	s.tmp = make([]cand, 0, nVocab)
	if (cfg.TopK <= 0 || cfg.TopK >= nVocab) && (cfg.TopP < 1 || cfg.MinP <= 0) {
		s.probs = make([]float32, nVocab) // topPAll, drawAll
	}

	for id := range cfg.LogitBias {
		s.biasID = append(s.biasID, int32(id))
	}
	slices.Sort(s.biasID)
	for _, id := range s.biasID {
		s.biasVal = append(s.biasVal, cfg.LogitBias[int(id)])
	}

	// llama.cpp skips the penalty sampler in the same cases.
	s.penalize = cfg.RepeatLastN != 0 &&
		(cfg.RepeatPenalty != 1 || cfg.PresencePenalty != 0 || cfg.FrequencyPenalty != 0)
	if s.penalize {
		s.counts = make([]int32, nVocab)
		s.pos = make([]int32, nVocab)
		if cfg.RepeatLastN > 0 {
			s.distinct = make([]int32, 0, min(cfg.RepeatLastN, nVocab, 1024))
		}
	}
	return s, nil
}

// pcgStream is PCG's second seed word. Any constant works; fixing it means
// the one Seed value fully determines the stream.
const pcgStream = 0x9e3779b97f4a7c15

// Seed returns the seed in use: Config.Seed, or the random one New chose.
func (s *Sampler) Seed() uint64 { return s.seed }

// Config returns the configuration the sampler was built with.
func (s *Sampler) Config() Config { return s.cfg }

// Reset forgets the accepted tokens and rewinds the random stream, so a
// reset sampler repeats the draws it made after New (as llama.cpp's reset
// does for its dist sampler).
func (s *Sampler) Reset() {
	for _, t := range s.distinct {
		s.counts[t] = 0
	}
	s.distinct = s.distinct[:0]
	s.ring, s.ringHead = s.ring[:0], 0
	s.pcg.Seed(s.seed, pcgStream)
}

// Accept records a token as generated (or seen, for prompt tokens the
// caller wants penalised) so the penalties account for it. Ids outside the
// vocabulary are ignored: there is no logit to penalise.
func (s *Sampler) Accept(token int) {
	if !s.penalize || token < 0 || token >= s.n {
		return
	}
	if w := s.cfg.RepeatLastN; w > 0 { // bounded window: evict the oldest when full
		if len(s.ring) < w {
			s.ring = append(s.ring, int32(token))
		} else {
			s.dec(s.ring[s.ringHead])
			s.ring[s.ringHead] = int32(token)
			s.ringHead = (s.ringHead + 1) % w
		}
	}
	s.inc(int32(token))
}

func (s *Sampler) inc(t int32) {
	s.counts[t]++
	if s.counts[t] == 1 {
		s.pos[t] = int32(len(s.distinct))
		s.distinct = append(s.distinct, t)
	}
}

func (s *Sampler) dec(t int32) {
	s.counts[t]--
	if s.counts[t] == 0 { // swap-remove t from distinct
		i, last := s.pos[t], s.distinct[len(s.distinct)-1]
		s.distinct[i] = last
		s.pos[last] = i
		s.distinct = s.distinct[:len(s.distinct)-1]
	}
}

// Sample picks the next token from logits (len nVocab), which it does not
// modify. It does not call Accept: the caller does once it keeps the token.
func (s *Sampler) Sample(logits []float32) (int, error) {
	if len(logits) != s.n {
		return 0, fmt.Errorf("sampler: got %d logits, want the vocabulary size %d", len(logits), s.n)
	}
	if s.plainGreedy() {
		return greedyArgmax(logits, nil)
	}
	s.prepare(logits)
	if s.cfg.Temperature == 0 {
		return s.argmax()
	}
	if s.unfiltered() {
		return s.drawAll()
	}
	c, err := s.candidates()
	if err != nil {
		return 0, err
	}
	return s.draw(c), nil
}

// SampleMasked is Sample restricted to the tokens set in allowed, a bit set
// over the vocabulary (token t is bit t%64 of word t/64), as constrained
// decoding gives it: the others are banned after penalties and bias, so
// every later step (top-k, top-p, min-p, temperature) works on the allowed
// tokens alone. A nil allowed allows every token.
func (s *Sampler) SampleMasked(logits []float32, allowed []uint64) (int, error) {
	if allowed == nil {
		return s.Sample(logits)
	}
	if len(logits) != s.n {
		return 0, fmt.Errorf("sampler: got %d logits, want the vocabulary size %d", len(logits), s.n)
	}
	if len(allowed) < (s.n+63)/64 {
		return 0, fmt.Errorf("sampler: the mask has %d words, the vocabulary needs %d", len(allowed), (s.n+63)/64)
	}
	if s.plainGreedy() {
		return greedyArgmax(logits, allowed[:(s.n+63)/64])
	}
	s.prepare(logits)
	s.mask(allowed)
	if s.cfg.Temperature == 0 {
		return s.argmax()
	}
	if s.unfiltered() {
		return s.drawAll()
	}
	c, err := s.candidates()
	if err != nil {
		return 0, err
	}
	return s.draw(c), nil
}

// mask bans the tokens whose bit in allowed is clear.
func (s *Sampler) mask(allowed []uint64) {
	w := s.work
	ban := float32(math.Inf(-1))
	for i, word := range allowed[:(s.n+63)/64] {
		if word == ^uint64(0) {
			continue
		}
		base := i * 64
		end := min(base+64, s.n)
		if word == 0 {
			for j := base; j < end; j++ {
				w[j] = ban
			}
			continue
		}
		for j := base; j < end; j++ {
			if word>>(j-base)&1 == 0 {
				w[j] = ban
			}
		}
	}
}

// prepare copies logits into s.work and applies penalties and bias there.
func (s *Sampler) prepare(logits []float32) {
	w := s.work
	// NaN: a broken logit must never be drawn; +Inf would make the
	// softmax NaN.
	ops.SanitizeLogits(w, logits)
	if s.penalize {
		rp, freq, pres := s.cfg.RepeatPenalty, s.cfg.FrequencyPenalty, s.cfg.PresencePenalty
		for _, t := range s.distinct {
			l := w[t]
			if l <= 0 {
				l *= rp
			} else {
				l /= rp
			}
			w[t] = l - float32(s.counts[t])*freq - pres
		}
	}
	for i, id := range s.biasID {
		w[id] += s.biasVal[i]
	}
}

// plainGreedy: temperature 0 with no penalty and no bias, where the draw is
// the largest allowed logit and the logits need no working copy. A server
// step draws for every decoding request; copying the vocabulary first took
// more time than the search.
func (s *Sampler) plainGreedy() bool {
	return s.cfg.Temperature == 0 && !s.penalize && len(s.biasID) == 0
}

// greedyArgmax is the first index of the largest logit among those allowed (nil:
// all), as prepare, mask and argmax together give it: NaN never wins (it
// compares false) and +Inf wins (prepare makes it the largest float).
// Runs of whole allowed mask words take firstMax's vector scan: a mask
// that leaves out a few tokens (ignore_eos, most grammars' early states)
// made the plain loop 0.25 ms a draw over 152k logits (2 cores of a Xeon).
func greedyArgmax(logits []float32, allowed []uint64) (int, error) {
	if allowed == nil {
		return firstMax(logits)
	}
	best, bestL := -1, float32(math.Inf(-1))
	runLo := -1 // the first logit of a run of whole allowed words, not yet scanned
	flush := func(hi int) {
		if runLo < 0 {
			return
		}
		if i, err := firstMax(logits[runLo:hi]); err == nil && logits[runLo+i] > bestL {
			best, bestL = runLo+i, logits[runLo+i]
		}
		runLo = -1
	}
	for w, word := range allowed {
		lo := w * 64
		if lo >= len(logits) {
			break
		}
		hi := min(lo+64, len(logits))
		if word == ^uint64(0) {
			if runLo < 0 {
				runLo = lo
			}
			continue
		}
		flush(lo)
		for j := lo; j < hi && word != 0; j++ {
			if word>>(j-lo)&1 != 0 && logits[j] > bestL {
				best, bestL = j, logits[j]
			}
		}
	}
	flush(min(len(allowed)*64, len(logits)))
	if best < 0 {
		return 0, ErrNoCandidates
	}
	return best, nil
}

// firstMax is greedyArgmax over every logit: the largest of each block of
// argmaxBlock (ops.MaxF32, vector code), then the first index of the
// overall largest in the first block that holds it. A server step makes
// this draw for every decoding request; a plain scan of 150k logits took
// about 0.1 ms, a part of every token's time.
func firstMax(logits []float32) (int, error) {
	bestBlock, bestL := -1, float32(math.Inf(-1))
	for lo := 0; lo < len(logits); lo += argmaxBlock {
		if m := ops.MaxF32(logits[lo:min(lo+argmaxBlock, len(logits))]); m > bestL {
			bestBlock, bestL = lo, m
		}
	}
	if bestBlock < 0 {
		return 0, ErrNoCandidates
	}
	for i, l := range logits[bestBlock:] {
		if l == bestL {
			return bestBlock + i, nil
		}
	}
	panic("sampler: the block's maximum is not in it")
}

const argmaxBlock = 4096

// argmax is the greedy draw over the prepared logits (penalties, bias and
// mask applied; NaN made -Inf): the first of the largest, by firstMax's
// vector scan.
func (s *Sampler) argmax() (int, error) { return firstMax(s.work) }

// candidates runs top-k, top-p and min-p over s.work and returns what is
// left, most likely first when sorted is reported (not needed by draw).
// Without top-k, top-p and min-p scan the whole vocabulary in ops' vector
// kernels (topPAll, aboveLogit): a candidate for each of 152k tokens and
// an exponential each took 2.4 ms a draw (2 cores of a Xeon).
func (s *Sampler) candidates() ([]cand, error) {
	var c []cand
	sorted := false
	switch k := s.cfg.TopK; {
	case k > 0 && k < s.n:
		c = topKLogits(s.cands[:k], s.work)
		for len(c) > 0 && math.IsInf(float64(c[len(c)-1].logit), -1) {
			c = c[:len(c)-1] // fewer than k tokens are allowed at all
		}
		if len(c) > 0 && s.cfg.TopP < 1 {
			c = s.topP(c)
		}
		sorted = true
	case s.cfg.TopP < 1:
		c, sorted = s.topPAll(), true
	case s.cfg.MinP > 0:
		c = s.aboveLogit(s.minPLogit())
	default:
		c = s.cands[:0]
		for i, l := range s.work {
			if !math.IsInf(float64(l), -1) { // banned tokens have p = 0
				c = append(c, cand{id: int32(i), logit: l})
			}
		}
	}
	if len(c) == 0 {
		return nil, ErrNoCandidates
	}
	if s.cfg.MinP > 0 {
		c = minP(c, s.cfg.MinP, sorted)
	}
	return c, nil
}

// topKLogits fills dst (len k) with the k best tokens of logits, best first.
// A size-k min-heap over one pass costs O(n log k) and touches only k
// entries, which for k=40 over a 150k vocabulary is far cheaper than a sort.
func topKLogits(dst []cand, logits []float32) []cand {
	k := len(dst)
	for i := range dst {
		dst[i] = cand{id: int32(i), logit: logits[i]}
	}
	heapify(dst)
	// A newcomer enters only above the heap's worst: ids grow, so an equal
	// logit never does. The scan skips the rest in vector steps.
	for i := k; i < len(logits); i++ {
		i += ops.FirstAbove(logits[i:], dst[0].logit)
		if i == len(logits) {
			break
		}
		dst[0] = cand{id: int32(i), logit: logits[i]}
		siftDown(dst, 0)
	}
	slices.SortFunc(dst, cmpCand)
	return dst
}

// heapify makes h a min-heap under better: h[0] is the worst entry, the one
// a newcomer has to beat.
func heapify(h []cand) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

func siftDown(h []cand, i int) {
	for {
		worst, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && better(h[worst], h[l]) {
			worst = l
		}
		if r < len(h) && better(h[worst], h[r]) {
			worst = r
		}
		if worst == i {
			return
		}
		h[i], h[worst] = h[worst], h[i]
		i = worst
	}
}

// topP keeps the minimal most-likely prefix of c (sorted, most likely
// first: top-k's) whose probability reaches TopP (the token that crosses
// the threshold is kept). Probabilities are the softmax over c at
// temperature 1, as in llama.cpp.
func (s *Sampler) topP(c []cand) []cand {
	maxL := c[0].logit
	var sum float64
	for i := range c {
		p := float32(math.Exp(float64(c[i].logit - maxL)))
		c[i].p = p
		sum += float64(p)
	}
	if n := nucleus(c, float64(s.cfg.TopP)*sum); n > 0 {
		return c[:n]
	}
	return c // rounding kept the sum just under target: keep everything
}

// topPAll is topP over every allowed token of s.work, without a candidate
// per token. Sorting a whole vocabulary costs milliseconds while the
// nucleus is usually small, so the tokens are bucketed by logit (as
// llama.cpp does), the bucket where the mass from the top crosses the
// target found, and only the tokens at or above it gathered and sorted:
// the maximum and the exponentials in ops' vector kernels, the bucket
// masses in one scalar pass, a vector scan skipping the tokens below the
// cut. Sorted; empty when no token is allowed.
func (s *Sampler) topPAll() []cand {
	w, p := s.work, s.probs
	maxL := ops.MaxF32(w)
	if math.IsInf(float64(maxL), -1) {
		return nil // every token banned (NaN was made -Inf by prepare)
	}
	copy(p, w)
	ops.ExpShift(p, maxL)
	lo := maxL - bucketSpan
	var mass [nBuckets]float64
	for i, l := range w {
		if l != negInf { // banned: p = 0, where the vector exp leaves e^-87
			mass[bucketOf(l, lo)] += float64(p[i])
		}
	}
	var sum float64
	for _, m := range mass {
		sum += m
	}
	target := float64(s.cfg.TopP) * sum
	cut, cum := 0, 0.0
	for b := nBuckets - 1; b >= 0; b-- {
		if cum += mass[b]; cum >= target {
			cut = b
			break
		}
	}
	// bucketOf(l) >= cut holds from lo + cut/8 on; the scan starts an
	// eighth of a logit lower and bucketOf decides.
	from := negInf
	if cut > 0 {
		from = lo + float32(cut-1)*bucketSpan/nBuckets
	}
	c := s.tmp[:0]
	for i := 0; i < len(w); i++ {
		if i += ops.FirstAbove(w[i:], from); i == len(w) {
			break
		}
		if l := w[i]; l != negInf && bucketOf(l, lo) >= cut {
			c = append(c, cand{id: int32(i), logit: l, p: p[i]})
		}
	}
	slices.SortFunc(c, cmpCand)
	if n := nucleus(c, target); n > 0 {
		return c[:n]
	}
	return c // rounding kept the sum just under target: keep everything
}

// minPLogit is the lowest logit min-p keeps over s.work: the largest
// less ln(1/MinP) (minP's threshold).
func (s *Sampler) minPLogit() float32 {
	return ops.MaxF32(s.work) + float32(math.Log(float64(s.cfg.MinP)))
}

// aboveLogit returns the tokens of s.work whose logit is at least thr, in
// vocabulary order, found by a vector scan (few tokens pass min-p).
func (s *Sampler) aboveLogit(thr float32) []cand {
	w := s.work
	c := s.cands[:0]
	if math.IsInf(float64(thr), -1) {
		return c // every token banned
	}
	below := math.Nextafter32(thr, float32(math.Inf(-1))) // l > below: l >= thr
	for i := 0; i < len(w); i++ {
		if i += ops.FirstAbove(w[i:], below); i == len(w) {
			break
		}
		c = append(c, cand{id: int32(i), logit: w[i]})
	}
	return c
}

// negInf is a banned token's logit (prepare, mask).
var negInf = float32(math.Inf(-1))

// Top-p buckets: nBuckets over the bucketSpan logits below the maximum;
// anything lower (probability < e^-32 of the top token's) shares bucket 0.
const (
	nBuckets   = 256
	bucketSpan = 32
)

func bucketOf(logit, lo float32) int {
	// Clamp before converting: float-to-int of an out-of-range value is
	// implementation-defined in Go.
	b := (logit - lo) * (nBuckets / bucketSpan)
	switch {
	case b <= 0:
		return 0
	case b >= nBuckets-1:
		return nBuckets - 1
	}
	return int(b)
}

// nucleus returns the length of the shortest prefix of sorted c whose p
// sum reaches target, or 0 if the whole of c does not.
func nucleus(c []cand, target float64) int {
	var cum float64
	for i, x := range c {
		cum += float64(x.p)
		if cum >= target {
			return i + 1
		}
	}
	return 0
}

// minP drops the tokens whose probability is below p times the best
// one's. In logit space that is logit < max + ln(minP) (llama.cpp's form),
// which needs no exponentials.
func minP(c []cand, p float32, sorted bool) []cand {
	maxL := c[0].logit
	if !sorted {
		for _, x := range c {
			maxL = max(maxL, x.logit)
		}
	}
	thr := maxL + float32(math.Log(float64(p)))
	if sorted {
		for i, x := range c {
			if x.logit < thr {
				return c[:i]
			}
		}
		return c
	}
	kept := c[:0]
	for _, x := range c {
		if x.logit >= thr {
			kept = append(kept, x)
		}
	}
	return kept
}

// unfiltered: no top-k, top-p or min-p, so the draw is over the whole
// vocabulary (drawAll).
func (s *Sampler) unfiltered() bool {
	return (s.cfg.TopK <= 0 || s.cfg.TopK >= s.n) && s.cfg.TopP >= 1 && s.cfg.MinP <= 0
}

// drawAll is draw over every allowed token of s.work, in vocabulary order
// as candidates would list them, without a candidate per token: the
// exponentials in ops' vector kernel (a candidate and a float64
// exponential per token took 2 ms a draw over 152k tokens).
func (s *Sampler) drawAll() (int, error) {
	w, p := s.work, s.probs
	maxL := ops.MaxF32(w)
	if math.IsInf(float64(maxL), -1) {
		return 0, ErrNoCandidates // every token banned
	}
	invT := 1 / s.cfg.Temperature
	for i, l := range w {
		p[i] = (l - maxL) * invT
	}
	ops.ExpShift(p, 0)
	var sum float64
	allowed, only := 0, 0
	for i, l := range w {
		if l == negInf {
			p[i] = 0 // banned: p = 0, where the vector exp leaves e^-87
			continue
		}
		sum += float64(p[i])
		allowed, only = allowed+1, i
	}
	if allowed == 1 {
		return only, nil // as draw: no random number spent
	}
	u := s.rng.Float64() * sum
	var cum float64
	last := -1
	for i, x := range p {
		if x > 0 {
			if cum += float64(x); u < cum {
				return i, nil
			}
			last = i
		}
	}
	return last, nil // rounding left u just above the final cum
}

// draw applies the temperature and draws one token from softmax(c/T).
func (s *Sampler) draw(c []cand) int {
	if len(c) == 1 {
		return int(c[0].id)
	}
	maxL := c[0].logit
	for _, x := range c {
		maxL = max(maxL, x.logit)
	}
	invT := 1 / float64(s.cfg.Temperature)
	var sum float64
	for i := range c {
		p := float32(math.Exp(float64(c[i].logit-maxL) * invT))
		c[i].p = p
		sum += float64(p)
	}
	u := s.rng.Float64() * sum
	var cum float64
	for _, x := range c {
		cum += float64(x.p)
		if u < cum {
			return int(x.id)
		}
	}
	// Rounding can leave u just above the final cum: take the last token
	// that had any probability.
	for i := len(c) - 1; i >= 0; i-- {
		if c[i].p > 0 {
			return int(c[i].id)
		}
	}
	return int(c[0].id)
}
