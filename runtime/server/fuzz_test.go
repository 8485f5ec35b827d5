package server

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"testing"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

// FuzzRequest sends arbitrary bodies to /v1/chat/completions and
// /v1/completions of a server on a tiny model. Whatever the body, the
// answer is a 200 or a 4xx with a JSON error: never a 5xx (a client's
// mistake is not the server's), never a crash. Generation is replaced by a
// few draws of the real sampler from the request's config, so every config
// the server accepts is also one the sampler can run.
//
//	go test ./runtime/server -run '^$' -fuzz FuzzRequest -fuzztime 10m
func FuzzRequest(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"repeat_penalty":1.1,"repeat_last_n":10000000000}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807}`,
		`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"namespace":1,"enable_thinking":false}}`,
		`{"messages":[{"role":"user","content":"hi"}],"logit_bias":{"0":-100,"1":-100,"2":100},"temperature":0.5,"top_k":3,"top_p":0.5,"min_p":0.1,"seed":7}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"hi"}],"presence_penalty":2,"frequency_penalty":-2,"repeat_last_n":-1,"stop":["a","b"],"n":1,"reasoning_effort":"none"}`,
		`{"prompt":"hello","max_tokens":2,"echo":true}`,
		`{"prompt":[1,2,3],"max_tokens":2,"stream":true}`,
		`{"prompt":[[5,6]],"max_tokens":-1,"temperature":0}`,
	} {
		f.Add([]byte(seed), seed[2] == 'p')
	}
	sess := oracleSession(f, "tiny-qwen3-q4_k_m.gguf")
	s, err := New(sess, Config{ModelName: "tiny", QueueLimit: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	nVocab := s.nVocab
	s.gen = func(ctx context.Context, prompt []int, opt session.GenerateOptions) (*session.GenerateResult, error) {
		smp, err := sampler.New(opt.Sampler, nVocab)
		if err != nil {
			return nil, err // a 500: the server accepted a config the sampler refuses
		}
		for _, t := range prompt {
			smp.Accept(t)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		logits := make([]float32, nVocab)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64())
		}
		res := &session.GenerateResult{PromptTokens: len(prompt), StopReason: session.StopLength}
		n := 4
		if opt.MaxTokens > 0 {
			n = min(n, opt.MaxTokens)
		}
		for range n {
			tok, err := smp.Sample(logits)
			if err != nil {
				return res, err
			}
			smp.Accept(tok)
			res.Tokens = append(res.Tokens, tok)
			if err := opt.OnText(sess.Tok.TokenText(tok)); err != nil {
				return res, err
			}
		}
		return res, nil
	}
	f.Fuzz(func(t *testing.T, body []byte, completion bool) {
		path := "/v1/chat/completions"
		if completion {
			path = "/v1/completions"
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("POST", path, bytes.NewReader(body)))
		switch {
		case rec.Code == 200:
		case rec.Code >= 400 && rec.Code < 500:
			var e errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("%d with a body that is not a JSON error: %q", rec.Code, rec.Body.Bytes())
			}
		default:
			t.Fatalf("status %d for %s %q: %s", rec.Code, path, body, rec.Body.Bytes())
		}
	})
}
