package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Requests on --parallel slots run together, each step one batch, and
// each gets what it gets alone: its text and its log-probabilities.
func TestParallelRequests(t *testing.T) {
	var holding sync.WaitGroup
	holding.Add(1)
	release := make(chan struct{})
	var once sync.Once
	ts := startServerCtx(t, 2048, Config{Parallel: 4}, func(s *Server) {
		// Hold the first steps until the four requests are in, so that
		// they run together.
		s.testHookToken = func() {
			once.Do(holding.Done)
			<-release
		}
	})
	body := func(i int, stream bool) map[string]any {
		return map[string]any{"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("request %d: tell me about %d", i, i*7)}},
			"max_tokens": 12, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2, "stream": stream}
	}
	type reply struct {
		text     string
		logprobs []float64
	}
	run := func(i int, stream bool) reply {
		b, _ := json.Marshal(body(i, stream))
		resp, err := http.Post(ts.url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Error(err)
			return reply{}
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("request %d: %s", i, resp.Status)
			return reply{}
		}
		var r reply
		add := func(c map[string]any) {
			choices, _ := c["choices"].([]any)
			if len(choices) == 0 {
				return
			}
			ch := choices[0].(map[string]any)
			for _, k := range []string{"message", "delta"} {
				if m, ok := ch[k].(map[string]any); ok {
					if s, ok := m["content"].(string); ok {
						r.text += s
					}
				}
			}
			if lp, ok := ch["logprobs"].(map[string]any); ok {
				content, _ := lp["content"].([]any)
				for _, e := range content {
					r.logprobs = append(r.logprobs, e.(map[string]any)["logprob"].(float64))
				}
			}
		}
		if !stream {
			var c map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Error(err)
			}
			add(c)
			return r
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c map[string]any
			if err := json.Unmarshal([]byte(data), &c); err != nil {
				t.Error(err)
			}
			add(c)
		}
		return r
	}
	together := make([]reply, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { together[i] = run(i, i%2 == 0) })
	}
	holding.Wait()
	// Every request has a slot before the first step goes on.
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy := 0
		for _, sl := range ts.sched.Slots() {
			if sl.Busy {
				busy++
			}
		}
		if busy == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	code, slots := getJSONArray(t, ts.url+"/slots")
	close(release)
	if code != 200 || len(slots) != 4 {
		t.Errorf("/slots: %d %v", code, slots)
	}
	wg.Wait()
	batched := ts.metric(t, "ats_step_requests_count") - ts.metric(t, `ats_step_requests_bucket{le="1"}`)
	if batched == 0 {
		t.Error("no step held more than one request")
	}
	for i := range 4 {
		alone := run(i, i%2 == 1)
		if together[i].text != alone.text || len(together[i].logprobs) != 12 || fmt.Sprint(together[i].logprobs) != fmt.Sprint(alone.logprobs) {
			t.Errorf("request %d together: %q %v; alone %q %v", i, together[i].text, together[i].logprobs, alone.text, alone.logprobs)
		}
	}
	if n := ts.metric(t, "ats_slots"); n != 4 {
		t.Errorf("ats_slots %v", n)
	}
	code, props := postJSONGet(t, ts.url+"/props")
	if code != 200 || props["total_slots"] != 4.0 {
		t.Errorf("/props total_slots %v", props["total_slots"])
	}
	if kv, _ := props["kv_cache"].(map[string]any); kv["type_k"] != "f16" || kv["bytes"].(float64) <= 0 {
		t.Errorf("/props kv_cache %v", props["kv_cache"])
	}
}

// return_progress streams the prompt's evaluation before the text, up to
// the whole prompt.
func TestReturnProgress(t *testing.T) {
	ts := startServerCtx(t, 2048, Config{})
	long := strings.Repeat("a long prompt that takes several batches ", 30)
	b, _ := json.Marshal(map[string]any{"prompt": long, "max_tokens": 2, "stream": true, "return_progress": true})
	resp, err := http.Post(ts.url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %s", resp.Status, raw)
	}
	var progress []promptProgress
	text := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			PromptProgress *promptProgress `json:"prompt_progress"`
			Choices        []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatal(err)
		}
		if c.PromptProgress != nil {
			if text {
				t.Error("progress after the text")
			}
			progress = append(progress, *c.PromptProgress)
		}
		if len(c.Choices) > 0 && c.Choices[0].Text != "" {
			text = true
		}
	}
	if len(progress) < 2 {
		t.Fatalf("progress %v", progress)
	}
	last := progress[len(progress)-1]
	if last.Processed != last.Total || last.Total < 512 {
		t.Errorf("last progress %+v", last)
	}
	for k := 1; k < len(progress); k++ {
		if progress[k].Processed <= progress[k-1].Processed || progress[k].Total != last.Total {
			t.Errorf("progress %v", progress)
		}
	}
}

func getJSONArray(t *testing.T, url string) (int, []any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func postJSONGet(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}
