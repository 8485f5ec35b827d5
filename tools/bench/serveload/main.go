// Command serveload measures an OpenAI-compatible server under load: one
// completion of T tokens alone, then N at once, and prints the tokens/s of
// the single stream and of all N together (docs/performance.md):
//
//	go run ./tools/bench/serveload -url http://127.0.0.1:8080 -n 4 -t 128
//
// Each request is a /v1/completions of T tokens at temperature 0 with
// ignore_eos (llama-server's; ats ignores it, and a model that ends early
// shows as fewer tokens), after one warm-up request.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

type result struct {
	tokens int
	took   time.Duration
	err    error
}

func complete(url string, i, tokens int) result {
	body, _ := json.Marshal(map[string]any{
		"prompt": fmt.Sprintf("story number %d: once upon a time", i), "max_tokens": tokens,
		"temperature": 0, "ignore_eos": true,
	})
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return result{err: fmt.Errorf("%s: %s", resp.Status, b)}
	}
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return result{err: fmt.Errorf("reading the reply: %w", err)}
	}
	return result{tokens: out.Usage.CompletionTokens, took: time.Since(start)}
}

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "the server's base URL")
	n := flag.Int("n", 4, "concurrent requests")
	tokens := flag.Int("t", 128, "tokens per request")
	flag.Parse()
	if r := complete(*url, -1, *tokens); r.err != nil { // warm-up
		fmt.Fprintln(os.Stderr, "serveload:", r.err)
		os.Exit(1)
	}
	one := complete(*url, 0, *tokens)
	if one.err != nil {
		fmt.Fprintln(os.Stderr, "serveload:", one.err)
		os.Exit(1)
	}
	fmt.Printf("single: %d tokens in %.2f s = %.1f t/s\n", one.tokens, one.took.Seconds(), float64(one.tokens)/one.took.Seconds())
	results := make([]result, *n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		wg.Go(func() { results[i] = complete(*url, i, *tokens) })
	}
	wg.Wait()
	wall := time.Since(start)
	total, failed := 0, 0
	var each []string
	for _, r := range results {
		if r.err != nil {
			failed++
			fmt.Fprintln(os.Stderr, "serveload:", r.err)
			continue
		}
		total += r.tokens
		each = append(each, fmt.Sprintf("%.1fs", r.took.Seconds()))
	}
	fmt.Printf("concurrent %d: %d tokens in %.2f s = %.1f t/s aggregate; each done after %v\n", *n, total, wall.Seconds(), float64(total)/wall.Seconds(), each)
	if failed > 0 {
		os.Exit(1)
	}
}
