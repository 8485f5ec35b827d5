package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
)

const testCtx = 256 // tokens: small, so "too long" is easy to reach

// oracleSession opens an oracle model (made-up vocabulary, no chat
// template: the built-in ChatML one is used).
func oracleSession(t testing.TB, name string) *session.Session {
	return oracleSessionCtx(t, name, testCtx)
}

func oracleSessionCtx(t testing.TB, name string, ctxSize int) *session.Session {
	t.Helper()
	dir := testenv.SharedDir(t)
	m, err := model.Open(filepath.Join(dir, "testdata", "oracle", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := session.NewSession(m, session.Options{CtxSize: ctxSize, Threads: 2}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

type testServer struct {
	*Server
	http   *httptest.Server
	client openai.Client
	url    string
}

// startServer serves an oracle model on a loopback httptest server and
// returns an OpenAI client for it (no retries, so 503s are seen).
func startServer(t testing.TB, cfg Config, setup ...func(*Server)) *testServer {
	t.Helper()
	return startServerCtx(t, testCtx, cfg, setup...)
}

func startServerCtx(t testing.TB, ctxSize int, cfg Config, setup ...func(*Server)) *testServer {
	t.Helper()
	return startServerModel(t, "tiny-qwen3-q4_k_m.gguf", ctxSize, cfg, setup...)
}

// startServerModel is startServerCtx with another oracle model (a path
// under testdata/oracle).
func startServerModel(t testing.TB, name string, ctxSize int, cfg Config, setup ...func(*Server)) *testServer {
	t.Helper()
	sess := oracleSessionCtx(t, name, ctxSize)
	if cfg.ModelName == "" {
		cfg.ModelName = "tiny"
	}
	s, err := New(sess, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(s)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	opts := []option.RequestOption{option.WithBaseURL(hs.URL + "/v1/"), option.WithMaxRetries(0)}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	} else {
		opts = append(opts, option.WithAPIKey("unused"))
	}
	return &testServer{Server: s, http: hs, client: openai.NewClient(opts...), url: hs.URL}
}

// noEOG bans the end-of-generation tokens, so a request generates exactly
// max_tokens tokens whatever the random weights prefer.
func (ts *testServer) noEOG() map[string]int64 {
	m := map[string]int64{}
	for id := range ts.nVocab {
		if ts.sess.Tok.IsEOG(id) {
			m[strconv.Itoa(id)] = -100
		}
	}
	return m
}

func (ts *testServer) chatParams(user string, max int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     "tiny",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)},
		MaxTokens: openai.Int(max),
		Seed:      openai.Int(42),
		LogitBias: ts.noEOG(),
	}
}

// metric reads one sample of /metrics ("name" or `name{labels}`).
func (ts *testServer) metric(t testing.TB, series string) float64 {
	t.Helper()
	resp, err := http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	return 0
}

func TestChatCompletion(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	resp, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("Hello there", 8))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 {
		t.Fatalf("%d choices", len(resp.Choices))
	}
	c := resp.Choices[0]
	if c.FinishReason != "length" || c.Message.Role != "assistant" || c.Message.Content == "" {
		t.Errorf("choice %+v", c)
	}
	if resp.Usage.CompletionTokens != 8 || resp.Usage.PromptTokens == 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens+8 {
		t.Errorf("usage %+v", resp.Usage)
	}
	if resp.Model != "tiny" || !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Object != "chat.completion" {
		t.Errorf("model %q id %q object %q", resp.Model, resp.ID, resp.Object)
	}
	if !strings.Contains(resp.RawJSON(), `"timings":{"cache_n":0,"prompt_n":`) {
		t.Errorf("no timings in %s", resp.RawJSON())
	}

	// The same seed gives the same text; so does greedy sampling.
	again, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("Hello there", 8))
	if err != nil {
		t.Fatal(err)
	}
	if again.Choices[0].Message.Content != c.Message.Content {
		t.Errorf("same seed, different text: %q vs %q", again.Choices[0].Message.Content, c.Message.Content)
	}
	p := ts.chatParams("Hello there", 8)
	p.Temperature = openai.Float(0)
	p.Seed = openai.Int(1)
	g1, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	p.Seed = openai.Int(2)
	g2, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if g1.Choices[0].Message.Content != g2.Choices[0].Message.Content {
		t.Errorf("greedy differs across seeds: %q vs %q", g1.Choices[0].Message.Content, g2.Choices[0].Message.Content)
	}
	// The OpenAI penalties and top_p, and llama.cpp's extra fields.
	p.PresencePenalty = openai.Float(0.5)
	p.FrequencyPenalty = openai.Float(0.5)
	p.TopP = openai.Float(0.9)
	pen, err := ts.client.Chat.Completions.New(ctx, p, option.WithJSONSet("top_k", 5), option.WithJSONSet("min_p", 0.1))
	if err != nil || pen.Usage.CompletionTokens != 8 {
		t.Fatalf("with penalties: %v", err)
	}
	// max_completion_tokens wins over max_tokens.
	p.MaxCompletionTokens = openai.Int(3)
	g3, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if g3.Usage.CompletionTokens != 3 {
		t.Errorf("max_completion_tokens 3: generated %d", g3.Usage.CompletionTokens)
	}
}

func TestChatStreamingMatchesNonStreaming(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := ts.chatParams("Tell me a story", 24)
	want, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := ts.client.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	var text strings.Builder
	chunks, usageChunks := 0, 0
	var finish string
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		chunks++
		if ch.Object != "chat.completion.chunk" {
			t.Errorf("object %q", ch.Object)
		}
		if len(ch.Choices) == 0 {
			usageChunks++
			if ch.Usage.CompletionTokens != 24 {
				t.Errorf("usage chunk %+v", ch.Usage)
			}
			continue
		}
		text.WriteString(ch.Choices[0].Delta.Content)
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != want.Choices[0].Message.Content {
		t.Errorf("streamed %q, non-streamed %q", text.String(), want.Choices[0].Message.Content)
	}
	if acc.Choices[0].Message.Content != text.String() {
		t.Errorf("accumulator %q", acc.Choices[0].Message.Content)
	}
	if finish != "length" || usageChunks != 1 || chunks < 3 {
		t.Errorf("finish %q, %d usage chunks, %d chunks", finish, usageChunks, chunks)
	}
	// The second request reused the whole prompt but one token.
	if got := ts.metric(t, "ats_prompt_tokens_cached_total"); got == 0 {
		t.Errorf("no cached prompt tokens after a repeated prompt")
	}
}

func TestStopStrings(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := ts.chatParams("Hi", 16)
	p.Temperature = openai.Float(0)
	full, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	text := full.Choices[0].Message.Content
	if len(text) < 6 {
		t.Skipf("reply %q too short to cut", text)
	}
	stop := text[len(text)/2 : len(text)/2+3]
	cut := text[:strings.Index(text, stop)]
	for _, u := range []openai.ChatCompletionNewParamsStopUnion{
		{OfString: openai.String(stop)},
		{OfStringArray: []string{"\x00never", stop}},
	} {
		p.Stop = u
		got, err := ts.client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if got.Choices[0].Message.Content != cut || got.Choices[0].FinishReason != "stop" {
			t.Errorf("stop %q: got %q (%s), want %q", stop, got.Choices[0].Message.Content, got.Choices[0].FinishReason, cut)
		}
	}
}

func TestPromptCacheAcrossTurns(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := ts.chatParams("What is the capital of France?", 6)
	first, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	p.Messages = append(p.Messages,
		openai.AssistantMessage(first.Choices[0].Message.Content),
		openai.UserMessage("And of Italy?"))
	second, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	cached := second.Usage.PromptTokensDetails.CachedTokens
	if cached < first.Usage.PromptTokens {
		t.Errorf("second turn reused %d cached tokens; the first prompt alone had %d", cached, first.Usage.PromptTokens)
	}
	if cached >= second.Usage.PromptTokens {
		t.Errorf("cached %d of %d prompt tokens", cached, second.Usage.PromptTokens)
	}
}

func TestCompletions(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	params := openai.CompletionNewParams{
		Model:     "tiny",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(10),
		Seed:      openai.Int(7),
		LogitBias: ts.noEOG(),
	}
	resp, err := ts.client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Object != "text_completion" || len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 10 {
		t.Fatalf("response %s", resp.RawJSON())
	}
	stream := ts.client.Completions.NewStreaming(ctx, params)
	var text strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != resp.Choices[0].Text {
		t.Errorf("streamed %q, non-streamed %q", text.String(), resp.Choices[0].Text)
	}
	// Token ids and echo.
	params.Prompt = openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 20, 30, 40}}
	params.Echo = openai.Bool(true)
	params.MaxTokens = openai.Int(2)
	echo, err := ts.client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	prefix := ts.sess.Tok.Decode([]int{1, 20, 30, 40})
	if !strings.HasPrefix(echo.Choices[0].Text, prefix) || echo.Usage.PromptTokens != 4 {
		t.Errorf("echo: %q does not start with %q (usage %+v)", echo.Choices[0].Text, prefix, echo.Usage)
	}
	// Without max_tokens, OpenAI's default of 16.
	params.MaxTokens = openai.Int(0)
	params = openai.CompletionNewParams{Model: "tiny", LogitBias: ts.noEOG(),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}}
	def, err := ts.client.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if def.Usage.CompletionTokens != defaultCompletionTokens {
		t.Errorf("default max_tokens: %d tokens", def.Usage.CompletionTokens)
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	page, err := ts.client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "tiny" || page.Data[0].OwnedBy != "ats" {
		t.Fatalf("models %s", page.RawJSON())
	}
	m, err := ts.client.Models.Get(ctx, "tiny")
	if err != nil || m.ID != "tiny" {
		t.Fatalf("model: %v %+v", err, m)
	}
	_, err = ts.client.Models.Get(ctx, "gpt-5")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("unknown model: %v", err)
	}

	resp, err := http.Get(ts.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if resp.StatusCode != 200 || h["status"] != "ok" {
		t.Errorf("health %d %v", resp.StatusCode, h)
	}

	if _, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("hi", 4)); err != nil {
		t.Fatal(err)
	}
	// A handler counts its request after the client has the last byte.
	deadline := time.Now().Add(5 * time.Second)
	for ts.metric(t, `ats_requests_total{code="200",endpoint="/chat/completions"}`) != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got, want := ts.metric(t, `ats_weight_bytes{device="cpu"}`), float64(ts.sess.Model.WeightBytes()); got != want {
		t.Errorf("cpu weight bytes %v, want %v", got, want)
	}
	resp, err = http.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`ats_requests_total{code="200",endpoint="/chat/completions"} 1`,
		`ats_backend_info{backend="cpu"} 1`,
		`ats_weight_bytes{device="gpu"} 0`,
		"ats_gpus 0",
		"ats_queue_length 0",
		"ats_queue_limit 0",
		"ats_time_to_first_token_seconds_count 1",
		"ats_time_per_output_token_seconds_count 1",
		"ats_generated_tokens_total 4",
		"ats_decode_tokens_per_second ",
		"ats_context_size 256",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestGPUMetricsHook checks the series a GPU backend will feed.
func TestGPUMetricsHook(t *testing.T) {
	ts := startServer(t, Config{
		Placement: func() Placement {
			return Placement{Backend: "cpu+cuda", WeightBytes: map[string]int64{"cpu": 10, "gpu": 20}, PromotedBytes: 5}
		},
		GPUStats: func() []GPUStat {
			return []GPUStat{{Index: 0, Name: "H200", MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 2 << 30, Utilization: 0.5, PCIeRxBytesPerS: 1e9}}
		},
	})
	for series, want := range map[string]float64{
		`ats_backend_info{backend="cpu+cuda"}`:                  1,
		`ats_weight_bytes{device="gpu"}`:                        20,
		`ats_promoted_weight_bytes`:                             5,
		`ats_gpus`:                                              1,
		`ats_gpu_memory_used_bytes{gpu="0",name="H200"}`:        1 << 30,
		`ats_gpu_utilization_ratio{gpu="0",name="H200"}`:        0.5,
		`ats_gpu_pcie_rx_bytes_per_second{gpu="0",name="H200"}`: 1e9,
	} {
		if got := ts.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}
