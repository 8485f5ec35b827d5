package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
)

// ollama's API through ollama's own Go client package.

func ollamaClient(t testing.TB, ts *testServer) *api.Client {
	u, err := url.Parse(ts.url)
	if err != nil {
		t.Fatal(err)
	}
	return api.NewClient(u, http.DefaultClient)
}

func TestOllamaModels(t *testing.T) {
	ts := startServer(t, Config{Embeddings: true, Pooling: "last"})
	c := ollamaClient(t, ts)
	ctx := context.Background()
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Models) != 1 || list.Models[0].Name != "tiny" || list.Models[0].Details.Family != "qwen3" || list.Models[0].Details.Format != "gguf" || list.Models[0].Size == 0 {
		t.Fatalf("tags %+v", list.Models)
	}
	show, err := c.Show(ctx, &api.ShowRequest{Model: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if show.Template == "" || show.ModelInfo["general.architecture"] != "qwen3" || !strings.Contains(strings.Join(toStrings(show.Capabilities), " "), "embedding") {
		t.Errorf("show %+v", show)
	}
	if _, err := c.Show(ctx, &api.ShowRequest{Model: "other"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("show of another model: %v", err)
	}
	ps, err := c.ListRunning(ctx)
	if err != nil || len(ps.Models) != 1 || ps.Models[0].Name != "tiny" {
		t.Errorf("ps %+v %v", ps, err)
	}
	if v, err := c.Version(ctx); err != nil || v == "" {
		t.Errorf("version %q %v", v, err)
	}
	// Embeddings: unit vectors of the model's width, one per input.
	emb, err := c.Embed(ctx, &api.EmbedRequest{Model: "tiny", Input: []string{"hello world", "good night"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Embeddings) != 2 || len(emb.Embeddings[0]) != ts.sess.Model.Hyper().NEmbd {
		t.Fatalf("embed %d vectors", len(emb.Embeddings))
	}
	var norm float64
	for _, v := range emb.Embeddings[0] {
		norm += float64(v) * float64(v)
	}
	if math.Abs(norm-1) > 1e-4 {
		t.Errorf("|embedding|² = %v", norm)
	}
	one, err := c.Embed(ctx, &api.EmbedRequest{Model: "tiny", Input: "good night"})
	if err != nil || !closeVectors(one.Embeddings[0], emb.Embeddings[1], 1e-5) {
		t.Errorf("the same text alone embeds differently (%v)", err)
	}
}

func toStrings[T ~string](in []T) []string {
	out := make([]string, len(in))
	for i, v := range in {
		out[i] = string(v)
	}
	return out
}

func closeVectors(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > tol {
			return false
		}
	}
	return true
}

func TestOllamaChatAndGenerate(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{})
	c := ollamaClient(t, ts)
	ctx := context.Background()
	noEOG := map[string]any{}
	for k, v := range ts.noEOG() {
		noEOG[k] = v
	}
	opts := map[string]any{"temperature": 0, "num_predict": 8, "num_ctx": 4096, "num_gpu": 99}
	req := &api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hello there"}}, Options: opts}
	// Streamed (ollama's default): lines of pieces, then the statistics.
	var pieces []string
	var last api.ChatResponse
	if err := c.Chat(ctx, req, func(r api.ChatResponse) error {
		if !r.Done {
			pieces = append(pieces, r.Message.Content+r.Message.Thinking)
		}
		last = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !last.Done || last.EvalCount == 0 || last.PromptEvalCount == 0 || last.DoneReason == "" || len(pieces) == 0 {
		t.Fatalf("last line %+v, %d pieces", last, len(pieces))
	}
	// Not streamed: one object with the same reply.
	off := false
	req.Stream = &off
	var whole api.ChatResponse
	if err := c.Chat(ctx, req, func(r api.ChatResponse) error { whole = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := whole.Message.Content + whole.Message.Thinking; got != strings.Join(pieces, "") && strings.TrimSpace(got) != strings.TrimSpace(strings.Join(pieces, "")) {
		t.Errorf("whole %q, streamed %q", got, strings.Join(pieces, ""))
	}

	// generate, raw, with the context of the last answer.
	var gen api.GenerateResponse
	if err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "Once upon", Raw: true, Stream: &off, Options: opts},
		func(r api.GenerateResponse) error { gen = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if gen.Response == "" || !gen.Done || len(gen.Context) == 0 {
		t.Fatalf("generate %+v", gen)
	}
	var gen2 api.GenerateResponse
	if err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: " a time", Raw: true, Stream: &off, Options: opts, Context: gen.Context},
		func(r api.GenerateResponse) error { gen2 = r; return nil }); err != nil {
		t.Fatal(err)
	}
	// The second prompt is the first conversation and the new text.
	if len(gen2.Context) <= len(gen.Context) || !slicesHasPrefix(gen2.Context, gen.Context) {
		t.Errorf("context %v then %v", gen.Context, gen2.Context)
	}
	// format "json": the reply is a JSON object.
	opts2 := map[string]any{"num_predict": 300, "seed": 3}
	if err := c.Generate(ctx, &api.GenerateRequest{Model: "tiny", Prompt: "A JSON object:", Raw: true, Stream: &off, Options: opts2,
		Format: json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`)},
		func(r api.GenerateResponse) error { gen = r; return nil }); err != nil {
		t.Fatal(err)
	}
	var obj map[string]bool
	if err := json.Unmarshal([]byte(gen.Response), &obj); err != nil {
		t.Errorf("format schema: %q is not the object: %v", gen.Response, err)
	}
	// Errors come as {"error": "..."}, which the client reports.
	err := c.Chat(ctx, &api.ChatRequest{Model: "tiny", Messages: []api.Message{{Role: "user", Content: "x", Images: []api.ImageData{{1, 2}}}}}, func(api.ChatResponse) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "text-only") {
		t.Errorf("an image: %v", err)
	}
	err = c.Chat(ctx, &api.ChatRequest{Model: "tiny", Messages: req.Messages, Options: map[string]any{"mirostat": 2}}, func(api.ChatResponse) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "mirostat") {
		t.Errorf("mirostat 2: %v", err)
	}
	// A request without messages loads the model: done at once.
	var load api.ChatResponse
	if err := c.Chat(ctx, &api.ChatRequest{Model: "tiny"}, func(r api.ChatResponse) error { load = r; return nil }); err != nil || !load.Done || load.DoneReason != "load" {
		t.Errorf("load: %+v %v", load, err)
	}
}

func slicesHasPrefix(s, prefix []int) bool {
	return len(s) >= len(prefix) && slices.Equal(s[:len(prefix)], prefix)
}

func TestOllamaTools(t *testing.T) {
	var prompt string
	ts := startServerCtx(t, 2048, Config{}, func(s *Server) { say(s, qwenToolReply, &prompt) })
	c := ollamaClient(t, ts)
	props := api.NewToolPropertiesMap()
	props.Set("city", api.ToolProperty{Type: api.PropertyType{"string"}})
	tool := api.Tool{Type: "function", Function: api.ToolFunction{Name: "get_weather", Description: "Current weather",
		Parameters: api.ToolFunctionParameters{Type: "object", Required: []string{"city"}, Properties: props}}}
	think := &api.ThinkValue{Value: true}
	for _, stream := range []bool{false, true} {
		var calls []api.ToolCall
		var thinking string
		err := c.Chat(context.Background(), &api.ChatRequest{Model: "tiny", Stream: &stream, Think: think, Tools: api.Tools{tool},
			Messages: []api.Message{{Role: "user", Content: "Weather in Paris?"}}}, func(r api.ChatResponse) error {
			calls = append(calls, r.Message.ToolCalls...)
			thinking += r.Message.Thinking
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments.String() != `{"city":"Paris"}` {
			t.Errorf("stream %v: calls %+v", stream, calls)
		}
		if thinking != "The user wants the weather in Paris." {
			t.Errorf("stream %v: thinking %q", stream, thinking)
		}
	}
	if !strings.Contains(prompt, `"name": "get_weather"`) {
		t.Errorf("the tool is not in the prompt:\n%s", prompt)
	}
}
