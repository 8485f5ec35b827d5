package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// waitFor polls cond until it holds or the time runs out.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientCancel: a client that goes away mid-stream (or mid-request)
// stops its generation at once, and the model is free again.
func TestClientCancel(t *testing.T) {
	var tokens atomic.Int64
	ts := startServer(t, Config{}, func(s *Server) {
		s.testHookToken = func() {
			tokens.Add(1)
			time.Sleep(5 * time.Millisecond) // 150 tokens take 750 ms
		}
	})
	const max = 150

	check := func(t *testing.T, cancelled float64) {
		t.Helper()
		waitFor(t, "the cancellation", 5*time.Second, func() bool {
			return ts.metric(t, "ats_generations_cancelled_total") >= cancelled && ts.metric(t, "ats_requests_running") == 0
		})
		n := tokens.Load()
		time.Sleep(50 * time.Millisecond)
		if tokens.Load() != n {
			t.Errorf("generation goes on after the client left")
		}
		if n >= max {
			t.Errorf("all %d tokens were generated", n)
		}
	}

	t.Run("stream", func(t *testing.T) {
		tokens.Store(0)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream := ts.client.Chat.Completions.NewStreaming(ctx, ts.chatParams("Tell me a long story", max))
		chunks := 0
		for stream.Next() {
			if chunks++; chunks == 5 {
				cancel()
				break
			}
		}
		stream.Close()
		if chunks != 5 {
			t.Fatalf("%d chunks before the end: %v", chunks, stream.Err())
		}
		check(t, 1)
	})
	t.Run("non-stream", func(t *testing.T) {
		tokens.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("Tell me a long story", max))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v", err)
		}
		check(t, 2)
	})
	// The server still answers.
	ts.testHookToken = nil
	if _, err := ts.client.Chat.Completions.New(context.Background(), ts.chatParams("hi", 3)); err != nil {
		t.Fatal(err)
	}
}

// TestQueue: with one request running and the queue full, the next gets
// 503; the accepted ones all finish; a client that gives up while queued
// leaves the queue.
func TestQueue(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	ts := startServer(t, Config{QueueLimit: 1}, func(s *Server) {
		s.testHookToken = func() {
			once.Do(func() { close(started) })
			<-release
		}
	})
	ctx := context.Background()
	results := make(chan error, 2)
	send := func(ctx context.Context) {
		_, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("hi", 3))
		results <- err
	}
	go send(ctx)
	<-started
	// A queued request whose client gives up leaves the queue.
	qctx, qcancel := context.WithCancel(ctx)
	go send(qctx)
	waitFor(t, "a queued request", 5*time.Second, func() bool { return ts.metric(t, "ats_queue_length") == 1 })
	qcancel()
	if err := <-results; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled queued request: %v", err)
	}
	waitFor(t, "the queue to empty", 5*time.Second, func() bool { return ts.metric(t, "ats_queue_length") == 0 })

	go send(ctx)
	waitFor(t, "a queued request", 5*time.Second, func() bool { return ts.metric(t, "ats_queue_length") == 1 })
	// Now one runs and one waits: the queue is full.
	status, e, hdr := do(t, "POST", ts.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	if status != 503 || e.Error.Type != typeUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(e.Error.Message, "busy") {
		t.Errorf("full queue: %d %+v", status, e)
	}
	_, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("hi", 3))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Errorf("full queue through the client: %v", err)
	}
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Errorf("accepted request failed: %v", err)
		}
	}
	waitFor(t, "two 503s counted", 5*time.Second, func() bool {
		return ts.metric(t, `ats_requests_total{code="503",endpoint="/chat/completions"}`) == 2
	})
}

// TestLoad: several clients send many small requests at once to a server
// with a short queue. Every request is answered: 200 with a complete
// reply, or 503. None is lost, and no goroutine is left behind.
func TestLoad(t *testing.T) {
	ts := startServer(t, Config{QueueLimit: 2})
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	client := openai.NewClient(option.WithBaseURL(ts.url+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Transport: tr}))
	before := runtime.NumGoroutine()

	const clients, each = 4, 10
	var ok, busy atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				p := ts.chatParams("request", 4)
				p.Seed = openai.Int(int64(c*100 + i))
				var err error
				if i%2 == 0 {
					var resp *openai.ChatCompletion
					resp, err = client.Chat.Completions.New(context.Background(), p)
					if err == nil && (resp.Usage.CompletionTokens != 4 || resp.Choices[0].FinishReason != "length") {
						err = errors.New("incomplete reply: " + resp.RawJSON())
					}
				} else {
					stream := client.Chat.Completions.NewStreaming(context.Background(), p)
					finished := false
					for stream.Next() {
						if ch := stream.Current(); len(ch.Choices) > 0 && ch.Choices[0].FinishReason == "length" {
							finished = true
						}
					}
					err = stream.Err()
					if err == nil && !finished {
						err = errors.New("stream ended without a finish reason")
					}
				}
				var apiErr *openai.Error
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &apiErr) && apiErr.StatusCode == 503:
					busy.Add(1)
				default:
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("request failed: %v", err)
	}
	if ok.Load()+busy.Load() != clients*each || ok.Load() == 0 {
		t.Errorf("%d answered, %d turned away, of %d", ok.Load(), busy.Load(), clients*each)
	}
	t.Logf("%d answered, %d turned away (503)", ok.Load(), busy.Load())
	// A handler counts its request after the client has the last byte.
	waitFor(t, "the request counts", 5*time.Second, func() bool {
		return ts.metric(t, `ats_requests_total{code="200",endpoint="/chat/completions"}`) == float64(ok.Load()) &&
			ts.metric(t, `ats_requests_total{code="503",endpoint="/chat/completions"}`) == float64(busy.Load())
	})
	tr.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections() // ts.metric's
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readSSE reads a raw event stream: the data lines, and whether it ended
// with [DONE].
func readSSE(t *testing.T, resp *http.Response) (events []string, done bool) {
	t.Helper()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		events = append(events, data)
	}
	return events, done
}

// TestShutdown: a graceful shutdown lets a running request finish; one
// whose grace period ends first cancels the request, which is told why.
func TestShutdown(t *testing.T) {
	serve := func(t *testing.T) (*Server, string) {
		sess := oracleSession(t, "tiny-qwen3-q4_k_m.gguf")
		s, err := New(sess, Config{QueueLimit: 4})
		if err != nil {
			t.Fatal(err)
		}
		s.testHookToken = func() { time.Sleep(5 * time.Millisecond) }
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		t.Cleanup(func() {
			s.Close()
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
		return s, "http://" + ln.Addr().String()
	}
	stream := func(t *testing.T, url string, max int) *http.Response {
		body := `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":` + strconv.Itoa(max) + `,"logit_bias":{"2":-100}}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp
	}

	t.Run("finish", func(t *testing.T) {
		s, url := serve(t)
		resp := stream(t, url, 30)
		defer resp.Body.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut := make(chan error, 1)
		go func() { shut <- s.Shutdown(ctx) }()
		events, done := readSSE(t, resp)
		if !done || !strings.Contains(events[len(events)-1], `"finish_reason":"`) {
			t.Errorf("stream cut short: done %v, last %q", done, events[len(events)-1])
		}
		if err := <-shut; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if _, err := http.Get(url + "/health"); err == nil {
			t.Errorf("still accepting connections")
		}
	})
	t.Run("cancel", func(t *testing.T) {
		s, url := serve(t)
		resp := stream(t, url, 150)
		defer resp.Body.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := s.Shutdown(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown: %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Shutdown took %v", d)
		}
		events, done := readSSE(t, resp)
		if done || len(events) == 0 || !strings.Contains(events[len(events)-1], "shutting down") {
			t.Errorf("cancelled stream: done %v, events %d, last %q", done, len(events), events[len(events)-1])
		}
	})
}

// TestSlowClients: a client that sends its headers or its body too slowly
// is cut off; it never holds a connection (or the model) open.
func TestSlowClients(t *testing.T) {
	sess := oracleSession(t, "tiny-qwen3-q4_k_m.gguf")
	s, err := New(sess, Config{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })

	// A kept-alive connection outlives the write deadline of its last
	// response (net/http lifts it after each response).
	t.Run("keep-alive", func(t *testing.T) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		url := "http://" + ln.Addr().String() + "/v1/models"
		var conns atomic.Int32
		for i := range 2 {
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					if !info.Reused {
						conns.Add(1)
					}
				}})
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
			time.Sleep(300 * time.Millisecond) // past the 200 ms write deadline
		}
		if conns.Load() != 1 {
			t.Errorf("%d connections for 2 requests", conns.Load())
		}
	})
	for _, c := range []struct{ name, send, want string }{
		{"headers", "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n", ""},
		{"body", "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"messages\":", "400 Bad Request"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.Write([]byte(c.send))
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			got, err := io.ReadAll(conn) // until the server closes the connection
			if err != nil {
				t.Fatalf("the server kept the connection open: %v", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("closed after %v", d)
			}
			if !strings.Contains(string(got), c.want) {
				t.Errorf("response %q lacks %q", got, c.want)
			}
		})
	}
}
