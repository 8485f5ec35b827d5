package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// postJSON sends body to path and returns the status and decoded answer.
func postJSON(t testing.TB, url, path string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: not JSON: %q", path, raw)
	}
	return resp.StatusCode, out
}

// errorParam is the param of an OpenAI-shaped error.
func errorParam(out map[string]any) (string, string) {
	e, _ := out["error"].(map[string]any)
	p, _ := e["param"].(string)
	m, _ := e["message"].(string)
	return p, m
}

// A GBNF grammar and llama-server's top-level json_schema constrain the
// reply as response_format does.
func TestGrammarField(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{})
	ctx := context.Background()
	const grammar = `root ::= answer "."
answer ::= "yes" | "no" | [1-9] [0-9]{0,2} ( " " unit )?
unit ::= "apples" | "pears"`
	re := regexp.MustCompile(`^(yes|no|[1-9][0-9]{0,2}( (apples|pears))?)\.$`)
	for seed := range int64(4) {
		p := openai.ChatCompletionNewParams{
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("How many?")},
			MaxTokens: openai.Int(40), Seed: openai.Int(seed),
		}
		resp, err := ts.client.Chat.Completions.New(ctx, p, option.WithJSONSet("grammar", grammar),
			option.WithJSONSet("chat_template_kwargs", map[string]any{"enable_thinking": false}))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Choices[0].Message.Content; !re.MatchString(got) || resp.Choices[0].FinishReason != "stop" {
			t.Errorf("seed %d: %q (%s) does not follow the grammar", seed, got, resp.Choices[0].FinishReason)
		}
		// /v1/completions takes it too.
		c, err := ts.client.Completions.New(ctx, openai.CompletionNewParams{
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Count:")}, MaxTokens: openai.Int(40), Seed: openai.Int(seed),
		}, option.WithJSONSet("grammar", grammar))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Choices[0].Text; !re.MatchString(got) {
			t.Errorf("completion seed %d: %q does not follow the grammar", seed, got)
		}
	}
	// json_schema at the top level, as llama-server takes it.
	val := schemaValidator(t, orderSchema)
	var schema map[string]any
	json.Unmarshal([]byte(orderSchema), &schema)
	code, out := postJSON(t, ts.url, "/v1/completions", map[string]any{
		"prompt": "Order:", "max_tokens": 600, "seed": 1, "json_schema": schema})
	if code != 200 {
		t.Fatalf("json_schema: %d %v", code, out)
	}
	text := out["choices"].([]any)[0].(map[string]any)["text"].(string)
	mustValidate(t, val, text)
	// n_predict is llama-server's max_tokens.
	code, out = postJSON(t, ts.url, "/v1/completions", map[string]any{"prompt": "Hi", "n_predict": 3, "logit_bias": ts.noEOG()})
	if code != 200 || out["usage"].(map[string]any)["completion_tokens"].(float64) != 3 {
		t.Errorf("n_predict 3: %d %v", code, out["usage"])
	}
}

// What ats cannot honour is refused with a 400 that names the field; the
// values that change nothing pass.
func TestUnhonouredFields(t *testing.T) {
	ts := startServer(t, Config{})
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		path  string
		extra map[string]any
		param string // "" for a 200
		want  string
	}{
		{"/v1/chat/completions", map[string]any{"mirostat": 2}, "mirostat", "mirostat"},
		{"/v1/chat/completions", map[string]any{"mirostat": 0, "typical_p": 1, "cache_prompt": true, "ignore_eos": false, "user": "x", "metadata": map[string]any{"a": "b"}}, "", ""},
		{"/v1/chat/completions", map[string]any{"dry_multiplier": 0.8}, "dry_multiplier", "DRY"},
		{"/v1/chat/completions", map[string]any{"audio": map[string]any{"voice": "alloy"}}, "audio", "text-only"},
		{"/v1/chat/completions", map[string]any{"ignore_eos": true, "id_slot": -1}, "", ""},
		{"/v1/chat/completions", map[string]any{"id_slot": 2}, "id_slot", "slot"},
		{"/v1/completions", map[string]any{"xtc_probability": 0.5}, "xtc_probability", "XTC"},
		{"/v1/chat/completions", map[string]any{"grammar": `root ::= "a"`, "response_format": map[string]any{"type": "json_object"}}, "grammar", "cannot be combined"},
		{"/v1/chat/completions", map[string]any{"grammar": `root ::= "a`}, "grammar", "line 1"},
		{"/v1/chat/completions", map[string]any{"grammar": `root ::= thing`}, "grammar", `rule "thing" is used but not defined`},
		{"/v1/chat/completions", map[string]any{"json_schema": map[string]any{"type": "string", "pattern": "a+"}}, "json_schema", "pattern"},
		{"/v1/chat/completions", map[string]any{"json_schema": "x"}, "json_schema", "JSON Schema object"},
	} {
		body := map[string]any{"max_tokens": 2}
		if tc.path == "/v1/chat/completions" {
			body["messages"] = msgs
		} else {
			body["prompt"] = "hi"
		}
		for k, v := range tc.extra {
			body[k] = v
		}
		code, out := postJSON(t, ts.url, tc.path, body)
		if tc.param == "" {
			if code != 200 {
				t.Errorf("%v: %d %v", tc.extra, code, out)
			}
			continue
		}
		param, msg := errorParam(out)
		if code != 400 || param != tc.param || !strings.Contains(msg, tc.want) {
			t.Errorf("%v: %d param %q %q; want 400 naming %s and mentioning %q", tc.extra, code, param, msg, tc.param, tc.want)
		}
	}
}

// A grammar written as llama.cpp's examples are, with blanks at the end of
// a rule that recurs and again in its caller, is taken: the reply follows
// it (ats keeps every parse of the text where a blank could be either's).
func TestGrammarWithSeveralParses(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{})
	const grammar = `root  ::= list "."
list  ::= word ( "," blank list )? blank
word  ::= "yes" | "no" | "maybe"
blank ::= " "?`
	done := regexp.MustCompile(`^(yes|no|maybe)(, ?(yes|no|maybe))* *\.$`)
	part := regexp.MustCompile(`^[a-z, ]*$`)
	stopped := 0
	for seed := range 6 {
		code, out := postJSON(t, ts.url, "/v1/completions", map[string]any{
			"prompt": "Answers:", "max_tokens": 60, "seed": seed, "grammar": grammar})
		if code != 200 {
			t.Fatalf("seed %d: %d %v", seed, code, out)
		}
		choice := out["choices"].([]any)[0].(map[string]any)
		text, finish := choice["text"].(string), choice["finish_reason"].(string)
		switch {
		case finish == "stop" && !done.MatchString(text):
			t.Errorf("seed %d: %q does not follow the grammar", seed, text)
		case finish != "stop" && !part.MatchString(text):
			t.Errorf("seed %d: %q (%s) is not a start of the grammar's texts", seed, text, finish)
		}
		if finish == "stop" {
			stopped++
		}
		t.Logf("seed %d: %q (%s)", seed, text, finish)
	}
	t.Logf("%d of 6 replies ended", stopped)
}
