package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atsinfer/ats/runtime/text/chat"
)

// TestSoak sends a few hundred mixed requests from several clients at once:
// ordinary ones, streamed ones, hostile ones (issue 13's repros, malformed
// and oversized bodies, prompts too long, a template pushed past its
// limits) and ones whose clients give up midway. Every request must get an
// answer that makes sense for it (never a 5xx but the queue's 503), the
// server must still answer afterwards, and its goroutines and heap must
// come back to about where they started.
func TestSoak(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{QueueLimit: 6, MaxBodyBytes: 256 << 10}, func(s *Server) {
		// The built-in ChatML template, plus a switch that makes it
		// break its output limit.
		tmpl, err := chat.New(`{% if explode %}{{ 'x' * 10000000000 }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`)
		if err != nil {
			t.Fatal(err)
		}
		s.tmpl = tmpl
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	chatURL, complURL := ts.url+"/v1/chat/completions", ts.url+"/v1/completions"

	allBanned := map[string]int{}
	for id := range ts.nVocab {
		allBanned[strconv.Itoa(id)] = -100
	}
	ban, _ := json.Marshal(allBanned)
	msg := func(content, extra string) string {
		c, _ := json.Marshal(content)
		return `{"messages":[{"role":"user","content":` + string(c) + `}],"max_tokens":3,"logit_bias":{"2":-100}` + extra + `}`
	}
	type kind struct {
		name   string
		url    string
		body   string
		want   []int         // acceptable statuses (503: the queue was full)
		cancel time.Duration // > 0: the client gives up after this long
		stream bool
	}
	kinds := []kind{
		{"chat", chatURL, msg("hello there", ""), []int{200, 503}, 0, false},
		{"stream", chatURL, msg("tell me more", `,"stream":true`), []int{200, 503}, 0, true},
		{"completion", complURL, `{"prompt":"once upon a time","max_tokens":3}`, []int{200, 503}, 0, false},
		{"repeat_last_n 1e10", chatURL, msg("hi", `,"repeat_penalty":1.1,"repeat_last_n":10000000000`), []int{400}, 0, false},
		{"max_tokens MaxInt64", chatURL, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807}`, []int{400, 503}, 0, false},
		{"all banned", chatURL, msg("hi", `,"logit_bias":`+string(ban)), []int{400}, 0, false},
		{"kwargs namespace", chatURL, msg("hi", `,"chat_template_kwargs":{"namespace":1}`), []int{400}, 0, false},
		{"template explodes", chatURL, msg("hi", `,"chat_template_kwargs":{"explode":true}`), []int{400, 503}, 0, false},
		{"too long", chatURL, msg(strings.Repeat("many words here ", 2000), ""), []int{400, 503}, 0, false},
		{"malformed", chatURL, `{"messages":[{"role":"user","content":"hi"}`, []int{400}, 0, false},
		{"oversized", chatURL, msg(strings.Repeat("x", 300<<10), ""), []int{413}, 0, false},
		{"cancelled stream", chatURL, msg("a long story", `,"stream":true,"max_tokens":600`), nil, 30 * time.Millisecond, true},
		{"cancelled", chatURL, msg("a long story", `,"max_tokens":600`), nil, 20 * time.Millisecond, false},
	}

	// Warm up (first-use allocations: pools, the template), then measure.
	for _, k := range kinds[:3] {
		send(t, client, k.url, k.body, 0)
	}
	client.CloseIdleConnections()
	goroutines0, heap0 := settle()

	const clients, perClient = 10, 30
	var mu sync.Mutex
	counts := map[string]map[int]int{}
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				k := kinds[(c*perClient+i*7)%len(kinds)]
				status, body := send(t, client, k.url, k.body, k.cancel)
				mu.Lock()
				if counts[k.name] == nil {
					counts[k.name] = map[int]int{}
				}
				counts[k.name][status]++
				mu.Unlock()
				if k.cancel > 0 {
					if status != 0 && status != 503 && status != 200 {
						t.Errorf("%s: status %d: %.300s", k.name, status, body)
					}
					continue // status 0 (gave up) or whatever came first
				}
				ok := false
				for _, w := range k.want {
					ok = ok || status == w
				}
				if !ok {
					t.Errorf("%s: status %d, want one of %v: %.300s", k.name, status, k.want, body)
				}
				if status == 200 && k.stream && !strings.Contains(body, "data: [DONE]") {
					t.Errorf("%s: stream without [DONE]: %.300s", k.name, body)
				}
				if status != 200 && !strings.Contains(body, `"error"`) {
					t.Errorf("%s: %d without a JSON error: %.300s", k.name, status, body)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("statuses by kind: %v", counts)
	if counts["chat"][200] == 0 || counts["stream"][200] == 0 {
		t.Errorf("no ordinary request succeeded: %v", counts)
	}

	// Still answering.
	waitFor(t, "an idle model", 10*time.Second, func() bool { w, running := ts.q.length(); return w == 0 && running == 0 })
	if status, body := send(t, client, chatURL, msg("are you there?", ""), 0); status != 200 {
		t.Fatalf("after the soak: %d %s", status, body)
	}
	if status, _ := send(t, client, ts.url+"/health", "", 0); status != 200 {
		t.Errorf("/health after the soak: %d", status)
	}
	client.CloseIdleConnections()

	// Goroutines and heap back near where they started: nothing leaked
	// per request.
	var goroutines int
	var heap uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		goroutines, heap = settle()
		if goroutines <= goroutines0+4 && heap <= heap0+heap0/2+16<<20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("goroutines %d -> %d, heap %.1f -> %.1f MiB", goroutines0, goroutines, float64(heap0)/(1<<20), float64(heap)/(1<<20))
	if goroutines > goroutines0+4 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after\n%s", goroutines0, goroutines, buf[:runtime.Stack(buf, true)])
	}
	if heap > heap0+heap0/2+16<<20 {
		t.Errorf("heap: %d bytes before, %d after", heap0, heap)
	}
}

// send posts body to url (GETs when body is empty) and returns the status
// and the body; with cancel > 0 the client gives up after that long
// (status 0 when nothing came back in time).
func send(t *testing.T, client *http.Client, url, body string, cancel time.Duration) (int, string) {
	ctx := context.Background()
	if cancel > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, cancel)
		defer stop()
	}
	method := "POST"
	if body == "" {
		method = "GET"
	}
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	resp, err := client.Do(req)
	if err != nil {
		if cancel == 0 {
			t.Errorf("%s: %v", url, err)
		}
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// settle collects garbage and reports the goroutines and the live heap.
func settle() (int, uint64) {
	var ms runtime.MemStats
	for range 2 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}
