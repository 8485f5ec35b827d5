package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// `ats bench --serve URL` loads an OpenAI-compatible server (ats serve,
// llama-server, ...) the way users do: at each concurrency C, C streamed
// /v1/completions of -n tokens start together, at temperature 0 (by
// default) with ignore_eos, and the tool times each one's first token and
// its tokens after it. It reports the aggregate rate (all tokens over the wall time
// from the first request to the last token), time to first token and
// time per output token at p50 and p99, and each request's rate.
//
// At temperature 0 the requests of a synthetic (random-weight) model soon
// all emit the same token, so on a mixture of experts a batch's sequences
// route to the same experts and a batched step reads no more weights than
// one sequence's: --temperature T > 0 samples instead, with seed S+i for
// request i, so that runs repeat and requests differ.

// serveBenchOptions are the flags of the load test.
type serveBenchOptions struct {
	url          string
	concurrency  []int
	tokens       int
	promptTokens int // about this many prompt tokens (0: a short prompt)
	apiKey       string
	model        string
	late         bool // also time a request that arrives while the others decode
	timeout      time.Duration
	temperature  float64 // 0: greedy; above 0, request i also gets seed seed+i
	seed         int64
}

// serveRequest is one request's figures.
type serveRequest struct {
	PromptTokens int     `json:"prompt_tokens"`
	Tokens       int     `json:"completion_tokens"`
	TTFTms       float64 `json:"ttft_ms"`
	TPOTms       float64 `json:"tpot_ms"`      // (last token - first token) / (tokens - 1)
	Rate         float64 `json:"tokens_per_s"` // tokens after the first over the time after it
	Seconds      float64 `json:"seconds"`
	Err          string  `json:"error,omitempty"`
}

// serveBenchResult is one concurrency's row.
type serveBenchResult struct {
	URL          string         `json:"url"`
	Concurrency  int            `json:"concurrency"`
	MaxTokens    int            `json:"max_tokens"`
	PromptTokens int            `json:"prompt_tokens"`
	Aggregate    float64        `json:"aggregate_tokens_per_s"`
	WallSeconds  float64        `json:"wall_s"`
	TTFTp50      float64        `json:"ttft_p50_ms"`
	TTFTp99      float64        `json:"ttft_p99_ms"`
	TPOTp50      float64        `json:"tpot_p50_ms"`
	TPOTp99      float64        `json:"tpot_p99_ms"`
	Failed       int            `json:"failed"`
	LateTTFT     float64        `json:"ttft_late_ms,omitempty"` // a request arriving while the others decode
	Temperature  float64        `json:"temperature"`
	Seed         *int64         `json:"seed,omitempty"` // request i's seed is this plus i; none at temperature 0
	Requests     []serveRequest `json:"requests"`
}

// servePrompt is request i's prompt: distinct for every request (no
// shared cache between them), about n tokens of plain words when n > 0,
// at bytesPerToken bytes a token.
func servePrompt(i, n int, bytesPerToken float64) string {
	if n <= 0 {
		return fmt.Sprintf("story number %d: once upon a time", i)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Request %d. Summarise the following notes.\n", i)
	words := []string{"the", "river", "town", "market", "morning", "bridge", "stone", "light", "garden", "winter", "letter", "road"}
	for k := 0; float64(b.Len()) < bytesPerToken*float64(n); k++ {
		fmt.Fprintf(&b, "%s %s %d, ", words[(k+i)%len(words)], words[(3*k+7*i)%len(words)], k)
	}
	return b.String()
}

// bytesPerToken is how many bytes of servePrompt's text the server's
// tokenizer makes a token (its /tokenize, llama-server's and ats's), or
// five, English's usual, when it has none.
func bytesPerToken(ctx context.Context, client *http.Client, o serveBenchOptions) float64 {
	text := servePrompt(0, 400, 5)
	b, _ := json.Marshal(map[string]any{"content": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(o.url, "/")+"/tokenize", bytes.NewReader(b))
	if err != nil {
		return 5
	}
	req.Header.Set("Content-Type", "application/json")
	if o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 5
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []json.RawMessage `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Tokens) == 0 {
		return 5
	}
	return float64(len(text)) / float64(len(out.Tokens))
}

// streamCompletion sends request i of the run (servePrompt's index) and
// times its tokens; onFirst (nil: none) is called once, at its first
// token or its end.
func streamCompletion(ctx context.Context, client *http.Client, o serveBenchOptions, i int, prompt string, onFirst func()) serveRequest {
	var once sync.Once
	first := func() {
		if onFirst != nil {
			once.Do(onFirst)
		}
	}
	defer first()
	body := map[string]any{"prompt": prompt, "max_tokens": o.tokens, "temperature": 0, "ignore_eos": true,
		"stream": true, "stream_options": map[string]any{"include_usage": true}}
	if o.temperature > 0 {
		// Each request its own seed: the run repeats, and its requests
		// still sample different tokens from one another.
		body["temperature"], body["seed"] = o.temperature, o.seed+int64(i)
	}
	if o.model != "" {
		body["model"] = o.model
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(o.url, "/")+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return serveRequest{Err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if o.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return serveRequest{Err: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return serveRequest{Err: fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(msg))}
	}
	var r serveRequest
	var firstAt, last time.Time
	chunks := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &c) != nil {
			continue
		}
		if c.Usage != nil {
			r.PromptTokens, r.Tokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		if len(c.Choices) > 0 && c.Choices[0].Text != "" {
			now := time.Now()
			if firstAt.IsZero() {
				firstAt = now
				first()
			}
			last = now
			chunks++
		}
	}
	if err := sc.Err(); err != nil {
		r.Err = err.Error()
	}
	if r.Tokens == 0 {
		r.Tokens = chunks // a server without include_usage: a chunk a token
	}
	r.Seconds = time.Since(start).Seconds()
	if firstAt.IsZero() {
		if r.Err == "" {
			r.Err = "no tokens"
		}
		return r
	}
	r.TTFTms = float64(firstAt.Sub(start).Microseconds()) / 1e3
	if r.Tokens > 1 && last.After(firstAt) {
		after := last.Sub(firstAt).Seconds()
		r.TPOTms = 1e3 * after / float64(r.Tokens-1)
		r.Rate = float64(r.Tokens-1) / after
	}
	return r
}

// percentile is the p-th percentile (0..100) of v, nearest rank.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// runServeBench runs the load test at each concurrency.
func runServeBench(stdout, stderr io.Writer, o serveBenchOptions, format string) error {
	client := &http.Client{Timeout: o.timeout}
	ctx := context.Background()
	// A warm-up, as llama-bench has: the server's first request pays for
	// loading kernels and buffers.
	bpt := 5.0
	if o.promptTokens > 0 {
		bpt = bytesPerToken(ctx, client, o)
	}
	if w := streamCompletion(ctx, client, o, 0, servePrompt(0, o.promptTokens, bpt), nil); w.Err != "" {
		return fmt.Errorf("bench --serve: the warm-up request to %s: %s", o.url, w.Err)
	}
	var results []serveBenchResult
	if format == "md" {
		if o.temperature > 0 {
			fmt.Fprintf(stdout, "temperature %g, request i seeded %d+i\n\n", o.temperature, o.seed)
		}
		fmt.Fprintln(stdout, "| concurrency | prompt | tokens | aggregate t/s | per request t/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | late TTFT ms | failed |")
		fmt.Fprintln(stdout, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	}
	seq := 0
	for _, c := range o.concurrency {
		res := serveBenchResult{URL: o.url, Concurrency: c, MaxTokens: o.tokens, Temperature: o.temperature, Requests: make([]serveRequest, c)}
		if o.temperature > 0 {
			res.Seed = &o.seed
		}
		var wg, firsts sync.WaitGroup
		firsts.Add(c)
		start := time.Now()
		var end time.Time
		var mu sync.Mutex
		for i := range c {
			seq++
			k, prompt := seq, servePrompt(seq, o.promptTokens, bpt)
			wg.Go(func() {
				r := streamCompletion(ctx, client, o, k, prompt, firsts.Done)
				mu.Lock()
				res.Requests[i] = r
				if t := start.Add(time.Duration(r.Seconds * float64(time.Second))); t.After(end) {
					end = t
				}
				mu.Unlock()
			})
		}
		if o.late && c > 1 {
			// One more request once every other one is decoding: its time
			// to first token beside the running ones.
			firsts.Wait()
			seq++
			k := 1_000_000 + seq
			r := streamCompletion(ctx, client, o, k, servePrompt(k, o.promptTokens, bpt), nil)
			if r.Err != "" {
				fmt.Fprintf(stderr, "bench --serve: the late request at concurrency %d: %s\n", c, r.Err)
			}
			res.LateTTFT = r.TTFTms
		}
		wg.Wait()
		wall := end.Sub(start).Seconds()
		var ttft, tpot, rates []float64
		total := 0
		for _, r := range res.Requests {
			if r.Err != "" {
				res.Failed++
				fmt.Fprintf(stderr, "bench --serve: a request at concurrency %d: %s\n", c, r.Err)
				continue
			}
			total += r.Tokens
			res.PromptTokens = max(res.PromptTokens, r.PromptTokens)
			ttft = append(ttft, r.TTFTms)
			if r.TPOTms > 0 {
				tpot, rates = append(tpot, r.TPOTms), append(rates, r.Rate)
			}
		}
		res.WallSeconds = wall
		if wall > 0 {
			res.Aggregate = float64(total) / wall
		}
		res.TTFTp50, res.TTFTp99 = percentile(ttft, 50), percentile(ttft, 99)
		res.TPOTp50, res.TPOTp99 = percentile(tpot, 50), percentile(tpot, 99)
		results = append(results, res)
		if format == "md" {
			mean := 0.0
			for _, r := range rates {
				mean += r / float64(len(rates))
			}
			late := "-"
			if res.LateTTFT > 0 {
				late = fmt.Sprintf("%.0f", res.LateTTFT)
			}
			fmt.Fprintf(stdout, "| %d | %d | %d | %.1f | %.1f | %.0f | %.0f | %.1f | %.1f | %s | %d |\n", c, res.PromptTokens, o.tokens,
				res.Aggregate, mean, res.TTFTp50, res.TTFTp99, res.TPOTp50, res.TPOTp99, late, res.Failed)
		}
	}
	if format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	for _, r := range results {
		if r.Failed > 0 {
			return fmt.Errorf("bench --serve: %d of %d requests failed at concurrency %d", r.Failed, r.Concurrency, r.Concurrency)
		}
	}
	return nil
}
