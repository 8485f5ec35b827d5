package server

import (
	"context"
	"encoding/json"
	"math"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/constrain"
	"github.com/atsinfer/ats/tools/synth"
)

// A schema whose texts are bounded (enums, integers, booleans, a short
// array), so a random model ends its document within the token budget.
const orderSchema = `{"type":"object","properties":{
	"size":{"enum":["small","medium","large"]},
	"qty":{"type":"integer"},
	"hot":{"type":"boolean"},
	"extras":{"type":"array","items":{"enum":["milk","sugar"]},"maxItems":2},
	"note":{"type":["null","boolean"]}},
	"required":["size","qty","hot","extras","note"],"additionalProperties":false}`

func schemaValidator(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustValidate(t testing.TB, s *jsonschema.Schema, text string) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("not JSON: %q: %v", text, err)
	}
	if err := s.Validate(inst); err != nil {
		t.Fatalf("%q does not validate: %v", text, err)
	}
}

func schemaFormat(t testing.TB, schema string) openai.ChatCompletionNewParamsResponseFormatUnion {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(schema), &v); err != nil {
		t.Fatal(err)
	}
	return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "order", Schema: v, Strict: openai.Bool(true)}}}
}

// TestResponseFormatJSONSchema asks a random model for documents of a
// schema with the OpenAI client, streamed and not: every reply must parse
// and validate.
func TestResponseFormatJSONSchema(t *testing.T) {
	// The schema bounds a document to well under 1,000 bytes (whitespace
	// included), so 1,500 tokens always reach its end.
	ts := startServerCtx(t, 2048, Config{})
	val := schemaValidator(t, orderSchema)
	ctx := context.Background()
	for seed := range int64(4) {
		p := ts.chatParams("Order a coffee.", 1500)
		p.LogitBias = nil
		p.Seed = openai.Int(seed)
		p.Temperature = openai.Float(1)
		p.ResponseFormat = schemaFormat(t, orderSchema)
		resp, err := ts.client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		c := resp.Choices[0]
		if c.FinishReason != "stop" {
			t.Fatalf("seed %d: finish %q: %q", seed, c.FinishReason, c.Message.Content)
		}
		mustValidate(t, val, c.Message.Content)

		stream := ts.client.Chat.Completions.NewStreaming(ctx, p)
		var text strings.Builder
		finish := ""
		for stream.Next() {
			ch := stream.Current()
			if len(ch.Choices) > 0 {
				text.WriteString(ch.Choices[0].Delta.Content)
				if ch.Choices[0].FinishReason != "" {
					finish = ch.Choices[0].FinishReason
				}
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if finish != "stop" || text.String() != c.Message.Content {
			t.Fatalf("seed %d: streamed %q (%s), not streamed %q", seed, text.String(), finish, c.Message.Content)
		}
	}
}

// TestResponseFormatJSONObject: any JSON object, here greedy with a push
// towards closing it.
func TestResponseFormatJSONObject(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{})
	close, ok := ts.sess.Tok.Lookup("<0x7D>") // "}"
	if !ok {
		t.Fatal("no } token")
	}
	p := ts.chatParams("Anything.", 300)
	p.LogitBias = map[string]int64{itoa(close): 20}
	p.Temperature = openai.Float(0)
	p.ResponseFormat = openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONObject: &shared.ResponseFormatJSONObjectParam{}}
	resp, err := ts.client.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(resp.Choices[0].Message.Content), &obj); err != nil {
		t.Fatalf("%q is not a JSON object: %v", resp.Choices[0].Message.Content, err)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

var orderTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name: "order_coffee",
	Parameters: shared.FunctionParameters{
		"type": "object",
		"properties": map[string]any{
			"size": map[string]any{"enum": []string{"small", "large"}},
			"qty":  map[string]any{"type": "integer"},
		},
		"required":             []string{"size", "qty"},
		"additionalProperties": false,
	},
})

const orderToolSchema = `{"type":"object","properties":{"size":{"enum":["small","large"]},"qty":{"type":"integer"}},"required":["size","qty"],"additionalProperties":false}`

// TestForcedToolCall forces a call ("required", and by name) on the three
// tool-call formats, with the oracle models whose built-in templates are
// ChatML (Hermes), Llama 3 and GLM-4: the reply must be a call of the
// right function whose arguments validate.
func TestForcedToolCall(t *testing.T) {
	val := schemaValidator(t, orderToolSchema)
	for _, tc := range []struct {
		model  string
		format ToolFormat
	}{
		{"tiny-qwen3-q4_k_m.gguf", FormatHermes},
		{"tiny-llama-q8_0.gguf", FormatLlama3},
		{"tiny-glm4-q4_k_m.gguf", FormatGLM4},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			ts := startModel(t, oracleSessionCtx(t, tc.model, 3072))
			if ts.ToolFormat() != tc.format {
				t.Fatalf("format %v, want %v", ts.ToolFormat(), tc.format)
			}
			other := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_time"})
			for i, choice := range []openai.ChatCompletionToolChoiceOptionUnionParam{
				{OfAuto: openai.String("required")},
				openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "order_coffee"}),
			} {
				p := ts.chatParams("Order two small coffees.", 1000) // a bounded call: it ends well within
				p.LogitBias = nil
				p.Seed = openai.Int(int64(i))
				p.Tools = []openai.ChatCompletionToolUnionParam{orderTool}
				if i == 1 {
					p.Tools = append(p.Tools, other)
				}
				p.ToolChoice = choice
				p.ParallelToolCalls = openai.Bool(false)
				resp, err := ts.client.Chat.Completions.New(context.Background(), p)
				if err != nil {
					t.Fatal(err)
				}
				c := resp.Choices[0]
				if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
					t.Fatalf("choice %d: %s", i, c.RawJSON())
				}
				call := c.Message.ToolCalls[0]
				if call.Function.Name != "order_coffee" {
					t.Fatalf("choice %d: called %q", i, call.Function.Name)
				}
				mustValidate(t, val, call.Function.Arguments)

				// Streamed, the same call arrives as a tool-call delta.
				stream := ts.client.Chat.Completions.NewStreaming(context.Background(), p)
				var calls []openai.ChatCompletionChunkChoiceDeltaToolCall
				finish := ""
				for stream.Next() {
					if ch := stream.Current(); len(ch.Choices) > 0 {
						calls = append(calls, ch.Choices[0].Delta.ToolCalls...)
						if ch.Choices[0].FinishReason != "" {
							finish = ch.Choices[0].FinishReason
						}
					}
				}
				if err := stream.Err(); err != nil {
					t.Fatal(err)
				}
				if finish != "tool_calls" || len(calls) != 1 || calls[0].Function.Name != call.Function.Name || calls[0].Function.Arguments != call.Function.Arguments {
					t.Fatalf("choice %d: streamed %+v (%s), not streamed %+v", i, calls, finish, call.Function)
				}
			}
		})
	}
}

// TestToolCallGrammars checks the texts the forced-call grammars allow, in
// each family's format.
func TestToolCallGrammars(t *testing.T) {
	v, err := constrain.NewVocab(257, func(id int) string { return string([]byte{byte(id)}) }, []int{256})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{})
	tools, _, e := chatTools([]json.RawMessage{
		json.RawMessage(`{"type":"function","function":{"name":"order_coffee","parameters":` + orderToolSchema + `}}`),
		json.RawMessage(`{"type":"function","function":{"name":"get_time"}}`),
	})
	if e != nil {
		t.Fatal(e)
	}
	call := `{"name": "order_coffee", "arguments": {"size": "small", "qty": 2}}`
	for _, tc := range []struct {
		format   ToolFormat
		choice   forcedTool
		parallel bool
		good     []string
		bad      []string
	}{
		{FormatHermes, forcedTool{use: true, required: true}, true,
			[]string{"<tool_call>\n" + call + "\n</tool_call>", "<tool_call>" + call + "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
			[]string{call, "<tool_call>\n{\"name\": \"order_coffee\", \"arguments\": {\"size\": \"huge\", \"qty\": 2}}\n</tool_call>", "Sure! <tool_call>" + call + "</tool_call>"}},
		{FormatHermes, forcedTool{use: true, required: true, name: "order_coffee"}, false,
			[]string{"<tool_call>\n" + call + "\n</tool_call>"},
			[]string{"<tool_call>" + call + "</tool_call><tool_call>" + call + "</tool_call>", "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"}},
		{FormatLlama3, forcedTool{use: true, required: true}, true,
			[]string{`{"name": "order_coffee", "parameters": {"size": "large", "qty": 1}}`, `{"name":"get_time","parameters":{"tz":"UTC"}}`},
			[]string{call, `{"name": "order_coffee", "parameters": {"qty": 1}}`}},
		{FormatGLM4, forcedTool{use: true, required: true}, true,
			[]string{"order_coffee\n{\"size\": \"small\", \"qty\": 2}", "get_time\n{}"},
			[]string{"order_coffee {\"size\": \"small\", \"qty\": 2}", "make_tea\n{}"}},
	} {
		ts.format = tc.format
		con, e := ts.toolConstraint(tools, tc.choice, thinkSkip, tc.parallel)
		if e != nil {
			t.Fatal(e)
		}
		c := constrain.New(con.Grammar(), v)
		for _, s := range tc.good {
			m := c.NewMatcher()
			if err := m.AcceptString(s); err != nil || !m.Complete() {
				t.Errorf("%v %+v: refuses %q: %v", tc.format, tc.choice, s, err)
			}
		}
		for _, s := range tc.bad {
			m := c.NewMatcher()
			if err := m.AcceptString(s); err == nil && m.Complete() {
				t.Errorf("%v %+v: allows %q", tc.format, tc.choice, s)
			}
		}
	}
}

// startModel serves a session on a loopback server.
func startModel(t testing.TB, sess *session.Session) *testServer {
	t.Helper()
	s, err := New(sess, Config{ModelName: "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	client := openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithMaxRetries(0), option.WithAPIKey("unused"))
	return &testServer{Server: s, http: hs, client: client, url: hs.URL}
}

// TestChatLogprobs checks logprobs and top_logprobs of chat replies,
// streamed and not, with greedy decoding: each token is the most likely
// one, so it heads its own top list.
func TestChatLogprobs(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := ts.chatParams("Hello", 6)
	p.Temperature = openai.Float(0)
	p.Logprobs = openai.Bool(true)
	p.TopLogprobs = openai.Int(3)
	resp, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	content := c.Logprobs.Content
	if len(content) != 6 {
		t.Fatalf("%d logprob entries for 6 tokens: %s", len(content), c.RawJSON())
	}
	var text strings.Builder
	for i, e := range content {
		text.WriteString(e.Token)
		if len(e.TopLogprobs) != 3 {
			t.Fatalf("entry %d: %d top logprobs, want 3", i, len(e.TopLogprobs))
		}
		// The most likely token but the banned end of turn (no text).
		best := e.TopLogprobs[0]
		for _, tl := range e.TopLogprobs {
			if tl.Token != "" {
				best = tl
				break
			}
		}
		if best.Token != e.Token || best.Logprob != e.Logprob {
			t.Errorf("entry %d: greedy token %q (%v) is not the top one %q (%v)", i, e.Token, e.Logprob, best.Token, best.Logprob)
		}
		sum := 0.0
		for j, tl := range e.TopLogprobs {
			if tl.Logprob > 0 || j > 0 && tl.Logprob > e.TopLogprobs[j-1].Logprob {
				t.Errorf("entry %d: top logprobs not sorted or positive: %+v", i, e.TopLogprobs)
			}
			sum += math.Exp(tl.Logprob)
		}
		if sum > 1+1e-5 {
			t.Errorf("entry %d: top probabilities sum to %v", i, sum)
		}
		if string(bytesOf(e.Bytes)) != e.Token {
			t.Errorf("entry %d: bytes %v do not spell %q", i, e.Bytes, e.Token)
		}
	}
	if text.String() != c.Message.Content {
		t.Errorf("tokens spell %q, content is %q", text.String(), c.Message.Content)
	}

	stream := ts.client.Chat.Completions.NewStreaming(ctx, p)
	var streamed []openai.ChatCompletionTokenLogprob
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			streamed = append(streamed, ch.Choices[0].Logprobs.Content...)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != len(content) {
		t.Fatalf("streamed %d entries, not streamed %d", len(streamed), len(content))
	}
	for i := range streamed {
		if streamed[i].Token != content[i].Token || streamed[i].Logprob != content[i].Logprob {
			t.Errorf("entry %d: streamed %q %v, not streamed %q %v", i, streamed[i].Token, streamed[i].Logprob, content[i].Token, content[i].Logprob)
		}
	}
}

func bytesOf(b []int64) []byte {
	out := make([]byte, len(b))
	for i, x := range b {
		out[i] = byte(x)
	}
	return out
}

// TestCompletionLogprobs checks the legacy logprobs object, streamed and
// not.
func TestCompletionLogprobs(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := openai.CompletionNewParams{
		Model:       "tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens:   openai.Int(5),
		Temperature: openai.Float(0),
		Logprobs:    openai.Int(2),
		LogitBias:   ts.noEOG(),
	}
	resp, err := ts.client.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	lp := c.Logprobs
	if len(lp.Tokens) != 5 || len(lp.TokenLogprobs) != 5 || len(lp.TopLogprobs) != 5 || len(lp.TextOffset) != 5 {
		t.Fatalf("logprobs %s", c.Logprobs.RawJSON())
	}
	for i, tok := range lp.Tokens {
		if !strings.HasPrefix(c.Text[lp.TextOffset[i]:], tok) {
			t.Errorf("token %d %q is not at offset %d of %q", i, tok, lp.TextOffset[i], c.Text)
		}
		if len(lp.TopLogprobs[i]) == 0 || len(lp.TopLogprobs[i]) > 2 {
			t.Errorf("token %d: top %v", i, lp.TopLogprobs[i])
		}
		// The greedy token is in the top list, unless the banned end of
		// turn (no text) took a place in it.
		best, ok := lp.TopLogprobs[i][tok]
		_, eog := lp.TopLogprobs[i][""]
		if ok && best != lp.TokenLogprobs[i] || !ok && !eog {
			t.Errorf("token %d: greedy token %q (%v) missing from the top list %v", i, tok, lp.TokenLogprobs[i], lp.TopLogprobs[i])
		}
	}

	stream := ts.client.Completions.NewStreaming(ctx, p)
	var tokens []string
	var offsets []int64
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			tokens = append(tokens, ch.Choices[0].Logprobs.Tokens...)
			offsets = append(offsets, ch.Choices[0].Logprobs.TextOffset...)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(tokens, "|") != strings.Join(lp.Tokens, "|") || len(offsets) != len(lp.TextOffset) {
		t.Fatalf("streamed tokens %q offsets %v; not streamed %q %v", tokens, offsets, lp.Tokens, lp.TextOffset)
	}
	for i := range offsets {
		if offsets[i] != lp.TextOffset[i] {
			t.Errorf("offset %d: streamed %d, not streamed %d", i, offsets[i], lp.TextOffset[i])
		}
	}
}

// realVocabModel writes a tiny Qwen3 model with the real Qwen3 tokenizer
// and chat template (151,669 tokens) and serves it.
func realVocabModel(t *testing.T) *testServer {
	t.Helper()
	shared := testenv.SharedDir(t)
	path := filepath.Join(t.TempDir(), "tiny-qwen3-vocab.gguf")
	if _, err := synth.Write(path, synth.Options{Preset: "tiny-qwen3", Layout: "q8_0", Seed: 3,
		Vocab: filepath.Join(shared, "testdata", "vocab", "vocab-qwen3.gguf")}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	sess, err := session.NewSession(m, session.Options{CtxSize: 2048, Threads: 2}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sess.Close)
	return startModel(t, sess)
}

// TestRealVocabulary runs structured output, a forced tool call and
// logprobs on a model with Qwen3's real vocabulary and template (thinking
// off, so the reply is the constrained part alone).
func TestRealVocabulary(t *testing.T) {
	ts := realVocabModel(t)
	if ts.ToolFormat() != FormatHermes {
		t.Fatalf("format %v", ts.ToolFormat())
	}
	ctx := context.Background()
	noThink := option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false})
	val := schemaValidator(t, orderSchema)
	for seed := range int64(3) {
		p := ts.chatParams("Order a coffee.", 1500)
		p.LogitBias = nil
		p.Seed = openai.Int(seed)
		p.Temperature = openai.Float(1)
		p.ResponseFormat = schemaFormat(t, orderSchema)
		p.Logprobs = openai.Bool(true)
		resp, err := ts.client.Chat.Completions.New(ctx, p, noThink)
		if err != nil {
			t.Fatal(err)
		}
		c := resp.Choices[0]
		if c.FinishReason != "stop" {
			t.Fatalf("seed %d: finish %q: %q", seed, c.FinishReason, c.Message.Content)
		}
		mustValidate(t, val, c.Message.Content)
		var text strings.Builder
		for _, e := range c.Logprobs.Content {
			text.WriteString(e.Token)
		}
		if text.String() != c.Message.Content {
			t.Errorf("seed %d: logprob tokens spell %q, content %q", seed, text.String(), c.Message.Content)
		}
	}

	tval := schemaValidator(t, orderToolSchema)
	p := ts.chatParams("Order two small coffees.", 1000)
	p.LogitBias = nil
	p.Tools = []openai.ChatCompletionToolUnionParam{orderTool}
	p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
	p.ParallelToolCalls = openai.Bool(false)
	resp, err := ts.client.Chat.Completions.New(ctx, p, noThink)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "order_coffee" {
		t.Fatalf("%s", c.RawJSON())
	}
	mustValidate(t, tval, c.Message.ToolCalls[0].Function.Arguments)
}

// TestThinkingBeforeConstrainedPart checks the grammar a reasoning model
// gets: reasoning first (optional, or required when the prompt opened it),
// then the document.
func TestThinkingBeforeConstrainedPart(t *testing.T) {
	qwenTemplate := "...<think>\n\n</think>\n\n..."
	v, err := constrain.NewVocab(257, func(id int) string { return string([]byte{byte(id)}) }, []int{256})
	if err != nil {
		t.Fatal(err)
	}
	body := constrain.Lit(`{}`)
	for _, tc := range []struct {
		prompt string
		mode   thinkMode
		good   []string
		bad    []string
	}{
		{"<|im_start|>assistant\n", thinkOptional,
			[]string{"{}", "\n{}", "<think>\nhmm {}\n</think>\n\n{}"}, []string{"hmm {}", "<think>x"}},
		{"<|im_start|>assistant\n<think>\n", thinkForced,
			[]string{"hmm</think>\n\n{}", "</think>{}"}, []string{"{}", "hmm"}},
		{"<|im_start|>assistant\n<think>\n\n</think>\n\n", thinkSkip,
			[]string{"{}"}, []string{"<think></think>{}"}},
	} {
		mode := thinkModeFor(qwenTemplate, tc.prompt)
		if mode != tc.mode {
			t.Errorf("%q: mode %d, want %d", tc.prompt, mode, tc.mode)
		}
		g, err := constrain.Compile(mode.expr(body))
		if err != nil {
			t.Fatal(err)
		}
		c := constrain.New(g, v)
		for _, s := range tc.good {
			m := c.NewMatcher()
			if err := m.AcceptString(s); err != nil || !m.Complete() {
				t.Errorf("mode %d refuses %q: %v", mode, s, err)
			}
		}
		for _, s := range tc.bad {
			m := c.NewMatcher()
			if err := m.AcceptString(s); err == nil && m.Complete() {
				t.Errorf("mode %d allows %q", mode, s)
			}
		}
	}
	if m := thinkModeFor("no reasoning here", "<|im_start|>assistant\n"); m != thinkSkip {
		t.Errorf("a template without </think>: mode %d", m)
	}
}
