package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// errorBody is OpenAI's error JSON.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func do(t *testing.T, method, url, body string, header ...string) (int, errorBody, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e errorBody
	if resp.StatusCode != 200 {
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("%s %s: status %d, body is not JSON: %q", method, url, resp.StatusCode, raw)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("error Content-Type %q", ct)
		}
	}
	return resp.StatusCode, e, resp.Header
}

func TestErrors(t *testing.T) {
	ts := startServer(t, Config{MaxBodyBytes: 64 << 10})
	chat := ts.url + "/v1/chat/completions"
	long := strings.Repeat("hello world ", 200)
	msg := func(extra string) string {
		return `{"model":"tiny","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	for _, c := range []struct {
		name, method, url, body string
		status                  int
		param, typ, code        string
		contains                string
	}{
		{name: "malformed", body: `{"messages": [`, status: 400, contains: "malformed JSON"},
		{name: "syntax", body: `{"messages": [}`, status: 400, contains: "malformed JSON at offset"},
		{name: "trailing", body: msg("") + `{}`, status: 400, contains: "after the top-level object"},
		{name: "not an object", body: `[1,2]`, status: 400, contains: "must be a JSON object"},
		{name: "empty body", body: ``, status: 400, contains: "empty"},
		{name: "temperature type", body: msg(`,"temperature":"hot"`), status: 400, param: "temperature", contains: "expected a number, got string"},
		{name: "max_tokens type", body: msg(`,"max_tokens":1.5`), status: 400, param: "max_tokens", contains: "expected an integer"},
		{name: "messages type", body: `{"messages":"hi"}`, status: 400, param: "messages", contains: "expected an array"},
		{name: "stream type", body: msg(`,"stream":"yes"`), status: 400, param: "stream", contains: "expected a boolean"},
		{name: "content type", body: `{"messages":[{"role":"user","content":5}]}`, status: 400, param: "messages", contains: "content must be a string"},
		{name: "image part", body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, status: 400, contains: "text-only"},
		{name: "empty messages", body: `{"messages":[]}`, status: 400, param: "messages", contains: "messages is empty"},
		{name: "no messages", body: `{"model":"tiny"}`, status: 400, param: "messages", contains: "messages is empty"},
		{name: "bad role", body: `{"messages":[{"role":"wizard","content":"x"}]}`, status: 400, param: "messages[0].role", contains: "wizard"},
		{name: "no content", body: `{"messages":[{"role":"user"}]}`, status: 400, contains: "has no content"},
		{name: "prompt too long", body: `{"messages":[{"role":"user","content":"` + long + `"}]}`, status: 400, param: "messages", code: "context_length_exceeded", contains: "the context holds 256"},
		{name: "max_tokens too large", body: msg(`,"max_tokens":100000`), status: 400, param: "max_tokens", code: "context_length_exceeded", contains: "at most"},
		{name: "max_completion_tokens too large", body: msg(`,"max_completion_tokens":1000`), status: 400, param: "max_completion_tokens", contains: "at most"},
		{name: "max_tokens zero", body: msg(`,"max_tokens":0`), status: 400, param: "max_tokens", contains: "at least 1"},
		{name: "n", body: msg(`,"n":3`), status: 400, param: "n", contains: "must be 1"},
		{name: "stop type", body: msg(`,"stop":5`), status: 400, param: "stop"},
		{name: "stop empty", body: msg(`,"stop":[""]`), status: 400, param: "stop"},
		{name: "top_p", body: msg(`,"top_p":1.5`), status: 400, contains: "top_p"},
		{name: "temperature negative", body: msg(`,"temperature":-1`), status: 400, contains: "temperature"},
		{name: "logit_bias key", body: msg(`,"logit_bias":{"abc":1}`), status: 400, param: "logit_bias", contains: "not a token id"},
		{name: "logit_bias range", body: msg(`,"logit_bias":{"5":300}`), status: 400, param: "logit_bias"},
		{name: "logit_bias vocab", body: msg(`,"logit_bias":{"999999":1}`), status: 400, param: "logit_bias", contains: "outside the vocabulary"},
		{name: "stream_options without stream", body: msg(`,"stream_options":{"include_usage":true}`), status: 400, param: "stream_options"},
		{name: "tools type", body: msg(`,"tools":[{"type":"retrieval"}]`), status: 400, param: "tools[0].type"},
		{name: "tool_choice unknown function", body: msg(`,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}`), status: 400, param: "tool_choice"},
		{name: "tool_choice without tools", body: msg(`,"tool_choice":"required"`), status: 400, param: "tool_choice"},
		{name: "tool_choice unknown", body: msg(`,"tool_choice":"always"`), status: 400, param: "tool_choice"},
		{name: "tool parameters outside the subset", body: msg(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}],"tool_choice":"required"`), status: 400, param: "tools", contains: `"pattern" is not supported`},
		{name: "response_format", body: msg(`,"response_format":{"type":"json_schema"}`), status: 400, param: "response_format"},
		{name: "response_format type", body: msg(`,"response_format":{"type":"yaml"}`), status: 400, param: "response_format"},
		{name: "response_format schema outside the subset", body: msg(`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","format":"email"}}}`), status: 400, param: "response_format", contains: `"format" is not supported`},
		{name: "response_format and forced tool", body: msg(`,"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`), status: 400, param: "response_format"},
		{name: "top_logprobs range", body: msg(`,"logprobs":true,"top_logprobs":21`), status: 400, param: "top_logprobs"},
		{name: "top_logprobs without logprobs", body: msg(`,"top_logprobs":2`), status: 400, param: "top_logprobs"},
		{name: "completion logprobs range", url: ts.url + "/v1/completions", body: `{"prompt":"a","logprobs":30}`, status: 400, param: "logprobs"},
		{name: "completion logprobs with echo", url: ts.url + "/v1/completions", body: `{"prompt":"a","logprobs":1,"echo":true}`, status: 400, param: "logprobs"},
		{name: "reserved kwarg", body: msg(`,"chat_template_kwargs":{"messages":[]}`), status: 400, param: "chat_template_kwargs"},
		{name: "reasoning_effort", body: msg(`,"reasoning_effort":"extreme"`), status: 400, param: "reasoning_effort"},
		{name: "too large", body: `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 70<<10) + `"}]}`, status: 413, contains: "larger than"},
		{name: "completion no prompt", url: ts.url + "/v1/completions", body: `{"model":"tiny"}`, status: 400, param: "prompt"},
		{name: "completion prompt type", url: ts.url + "/v1/completions", body: `{"prompt":{"a":1}}`, status: 400, param: "prompt"},
		{name: "completion bad token", url: ts.url + "/v1/completions", body: `{"prompt":[1,2,99999]}`, status: 400, param: "prompt", contains: "outside the vocabulary"},
		{name: "completion too long", url: ts.url + "/v1/completions", body: `{"prompt":"` + long + `"}`, status: 400, param: "prompt", code: "context_length_exceeded"},
		{name: "completion suffix", url: ts.url + "/v1/completions", body: `{"prompt":"a","suffix":"b"}`, status: 400, param: "suffix"},
		{name: "unknown route", method: "POST", url: ts.url + "/v1/nothing-here", body: `{}`, status: 404, typ: typeNotFound, contains: "no such endpoint"},
		{name: "unknown page", method: "GET", url: ts.url + "/nope", status: 404, typ: typeNotFound},
		{name: "wrong method", method: "GET", url: chat, status: 405, contains: "use POST"},
		{name: "wrong method models", method: "DELETE", url: ts.url + "/v1/models", status: 405},
	} {
		t.Run(c.name, func(t *testing.T) {
			method, url := c.method, c.url
			if method == "" {
				method = "POST"
			}
			if url == "" {
				url = chat
			}
			status, e, hdr := do(t, method, url, c.body)
			if status != c.status {
				t.Fatalf("status %d, want %d: %+v", status, c.status, e.Error)
			}
			if e.Error.Message == "" {
				t.Errorf("no message")
			}
			typ := c.typ
			if typ == "" {
				typ = typeInvalidRequest
			}
			if e.Error.Type != typ {
				t.Errorf("type %q, want %q", e.Error.Type, typ)
			}
			if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
				t.Errorf("param %v, want %q (message %q)", e.Error.Param, c.param, e.Error.Message)
			}
			if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
				t.Errorf("code %v, want %q", e.Error.Code, c.code)
			}
			if !strings.Contains(e.Error.Message, c.contains) {
				t.Errorf("message %q lacks %q", e.Error.Message, c.contains)
			}
			if status == 405 && hdr.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
		})
	}
	// The server still works after all that.
	if _, err := ts.client.Chat.Completions.New(context.Background(), ts.chatParams("hi", 2)); err != nil {
		t.Fatal(err)
	}
}

// TestErrorsThroughClient checks that the OpenAI client reads the errors.
func TestErrorsThroughClient(t *testing.T) {
	ts := startServer(t, Config{})
	ctx := context.Background()
	p := ts.chatParams("hi", 100000)
	_, err := ts.client.Chat.Completions.New(ctx, p)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("error %v is not an *openai.Error", err)
	}
	if apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" || apiErr.Code != "context_length_exceeded" || !strings.Contains(apiErr.Message, "at most") {
		t.Errorf("error %+v", apiErr)
	}
	p = ts.chatParams("hi", 4)
	p.Messages = nil
	_, err = ts.client.Chat.Completions.New(ctx, p)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "messages" {
		t.Errorf("empty messages: %v", err)
	}
	// Streaming requests are checked before the stream starts.
	stream := ts.client.Chat.Completions.NewStreaming(ctx, ts.chatParams("hi", 100000))
	for stream.Next() {
		t.Errorf("chunk from a bad request")
	}
	if !errors.As(stream.Err(), &apiErr) || apiErr.StatusCode != 400 {
		t.Errorf("streaming bad request: %v", stream.Err())
	}
}

func TestAPIKey(t *testing.T) {
	ts := startServer(t, Config{APIKey: "sekrit"})
	ctx := context.Background()
	if _, err := ts.client.Chat.Completions.New(ctx, ts.chatParams("hi", 2)); err != nil {
		t.Fatalf("with the key: %v", err)
	}
	bad := openai.NewClient(option.WithBaseURL(ts.url+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
	_, err := bad.Chat.Completions.New(ctx, ts.chatParams("hi", 2))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("wrong key: %v", err)
	}
	for _, h := range [][]string{nil, {"Authorization", "sekrit"}, {"Authorization", "Bearer sekri"}} {
		status, e, hdr := do(t, "GET", ts.url+"/v1/models", "", h...)
		if status != 401 || e.Error.Type != typeAuthentication || hdr.Get("WWW-Authenticate") == "" {
			t.Errorf("header %q: %d %+v", h, status, e)
		}
	}
	if status, _, _ := do(t, "GET", ts.url+"/metrics", ""); status != 401 {
		t.Errorf("/metrics without key: %d", status)
	}
	if status, _, _ := do(t, "GET", ts.url+"/metrics", "", "Authorization", "Bearer sekrit"); status != 200 {
		t.Errorf("/metrics with key: %d", status)
	}
	// Health checks need no key.
	if status, _, _ := do(t, "GET", ts.url+"/health", ""); status != 200 {
		t.Errorf("/health: %d", status)
	}
}
