package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// post sends a JSON body and decodes the JSON answer.
func post(t *testing.T, url, body string, out any) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("POST %s: %d, not JSON: %q", url, resp.StatusCode, raw)
	}
	return resp.StatusCode
}

func TestTokenize(t *testing.T) {
	ts := startServer(t, Config{})
	tok := ts.sess.Tok
	url := ts.url + "/tokenize"
	var ids struct {
		Tokens []int `json:"tokens"`
	}

	if code := post(t, url, `{"content": "hello world"}`, &ids); code != 200 {
		t.Fatalf("status %d", code)
	}
	want := tok.Encode("hello world", false, true)
	if diff := cmp.Diff(want, ids.Tokens); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}

	// add_special: BOS, as the model wants (the oracle's vocabulary asks
	// for it). Special tokens in the text are parsed unless told not to.
	post(t, url, `{"content": "<s>hi", "add_special": true}`, &ids)
	if diff := cmp.Diff(append([]int{tok.BOS(), tok.BOS()}, tok.Encode("hi", false, false)...), ids.Tokens); diff != "" {
		t.Errorf("add_special with <s> in the text (-want +got):\n%s", diff)
	}
	post(t, url, `{"content": "<s>", "parse_special": false}`, &ids)
	if diff := cmp.Diff(tok.Encode("<s>", false, false), ids.Tokens); diff != "" || len(ids.Tokens) < 2 {
		t.Errorf("parse_special false (-want +got):\n%s", diff)
	}
	post(t, url, `{"content": ""}`, &ids)
	if ids.Tokens == nil || len(ids.Tokens) != 0 {
		t.Errorf("empty content: %v, want []", ids.Tokens)
	}

	// Mixed content: strings and ids; only a leading string gets BOS.
	post(t, url, `{"content": ["hi", 5, "yo"], "add_special": true}`, &ids)
	mixed := append(append(append([]int{tok.BOS()}, tok.Encode("hi", false, true)...), 5), tok.Encode("yo", false, true)...)
	if diff := cmp.Diff(mixed, ids.Tokens); diff != "" {
		t.Errorf("mixed content (-want +got):\n%s", diff)
	}
	post(t, url, `{"content": [7, "hi"], "add_special": true}`, &ids)
	if diff := cmp.Diff(append([]int{7}, tok.Encode("hi", false, true)...), ids.Tokens); diff != "" {
		t.Errorf("mixed content starting with an id (-want +got):\n%s", diff)
	}

	// with_pieces: text pieces as strings, partial UTF-8 as bytes.
	var pieces struct {
		Tokens []struct {
			ID    int             `json:"id"`
			Piece json.RawMessage `json:"piece"`
		} `json:"tokens"`
	}
	post(t, url, `{"content": "héllo ✓", "with_pieces": true}`, &pieces)
	var joined []byte
	sawBytes := false
	for i, p := range pieces.Tokens {
		if want := tok.Encode("héllo ✓", false, true)[i]; p.ID != want {
			t.Errorf("piece %d: id %d, want %d", i, p.ID, want)
		}
		var s string
		var b []byte
		if json.Unmarshal(p.Piece, &s) == nil {
			if !utf8.ValidString(s) {
				t.Errorf("piece %d: invalid UTF-8 sent as a string", i)
			}
			b = []byte(s)
		} else {
			var ints []int
			if err := json.Unmarshal(p.Piece, &ints); err != nil {
				t.Fatalf("piece %d is %s: neither a string nor bytes", i, p.Piece)
			}
			for _, v := range ints {
				b = append(b, byte(v))
			}
			sawBytes = true
		}
		if string(b) != tok.Piece(p.ID, true) {
			t.Errorf("piece %d = %q, want %q", i, b, tok.Piece(p.ID, true))
		}
		joined = append(joined, b...)
	}
	if !sawBytes {
		t.Error("no piece came as bytes; the oracle's vocabulary spells é and ✓ with byte tokens")
	}
	// The oracle's made-up vocabulary has no "▁", so SentencePiece's
	// spaces come back as the bytes of that character, as in llama.cpp.
	if got := strings.TrimPrefix(strings.ReplaceAll(string(joined), "▁", " "), " "); got != "héllo ✓" {
		t.Errorf("pieces join to %q", joined)
	}

	// Bad requests.
	var e errorBody
	for body, msg := range map[string]string{
		`{}`:                                     `"content" is required`,
		`{"content": null}`:                      `"content" is required`,
		`{"content": 5}`:                         "must be a string or an array",
		`{"content": ["a", true]}`:               "content[1]",
		`{"content": [600]}`:                     "outside the vocabulary of 512",
		`{"content": [-1]}`:                      "outside the vocabulary",
		`{"content": "x", "with_pieces": "yes"}`: "with_pieces",
	} {
		if code := post(t, url, body, &e); code != 400 || !strings.Contains(e.Error.Message, msg) {
			t.Errorf("%s: %d %q, want 400 with %q", body, code, e.Error.Message, msg)
		}
	}
	if code, _, _ := do(t, "GET", url, ""); code != 405 {
		t.Errorf("GET /tokenize: %d", code)
	}
}

func TestDetokenize(t *testing.T) {
	ts := startServer(t, Config{})
	tok := ts.sess.Tok
	url := ts.url + "/detokenize"
	var out struct {
		Content string `json:"content"`
	}
	ids := tok.Encode("hello world", true, true)
	if code := post(t, url, `{"tokens": `+mustJSON(t, ids)+`}`, &out); code != 200 {
		t.Fatalf("status %d", code)
	}
	// Pieces with special tokens as their text, as llama-server joins them.
	if want := tok.DecodeSpecial(ids); out.Content != want || !strings.HasPrefix(want, "<s>") {
		t.Errorf("content %q, want %q", out.Content, want)
	}
	post(t, url, `{"tokens": []}`, &out)
	if out.Content != "" {
		t.Errorf("no tokens: %q", out.Content)
	}
	var e errorBody
	if code := post(t, url, `{"tokens": [1, 512]}`, &e); code != 400 || !strings.Contains(e.Error.Message, "tokens[1] is 512") {
		t.Errorf("out of range: %d %q", code, e.Error.Message)
	}
	if code := post(t, url, `{"tokens": "hello"}`, &e); code != 400 {
		t.Errorf("tokens as a string: %d %q", code, e.Error.Message)
	}
}

func TestProps(t *testing.T) {
	ts := startServer(t, Config{APIKey: "k"})
	code, _, _ := do(t, "GET", ts.url+"/props", "")
	if code != 401 {
		t.Errorf("without the key: %d", code)
	}
	req, _ := http.NewRequest("GET", ts.url+"/props", nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct {
		Default struct {
			NCtx   int `json:"n_ctx"`
			Params struct {
				Temperature float64  `json:"temperature"`
				TopK        int      `json:"top_k"`
				TopP        float64  `json:"top_p"`
				MinP        float64  `json:"min_p"`
				Seed        uint64   `json:"seed"`
				NPredict    int      `json:"n_predict"`
				Samplers    []string `json:"samplers"`
			} `json:"params"`
		} `json:"default_generation_settings"`
		TotalSlots   int             `json:"total_slots"`
		ModelPath    string          `json:"model_path"`
		ModelAlias   string          `json:"model_alias"`
		ChatTemplate string          `json:"chat_template"`
		Modalities   map[string]bool `json:"modalities"`
		BuildInfo    string          `json:"build_info"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	d := p.Default
	if d.NCtx != testCtx || p.TotalSlots != 1 || p.ModelAlias != "tiny" || !strings.HasSuffix(p.ModelPath, "tiny-qwen3-q4_k_m.gguf") ||
		!strings.Contains(p.ChatTemplate, "im_start") || p.Modalities["vision"] || !strings.HasPrefix(p.BuildInfo, "ats") {
		t.Errorf("props %+v", p)
	}
	// The sampling defaults, with llama.cpp's "random" seed.
	if d.Params.Temperature != 0.8 || d.Params.TopK != 40 || d.Params.TopP != 0.95 || d.Params.MinP != 0.05 ||
		d.Params.Seed != 0xFFFFFFFF || d.Params.NPredict != -1 || len(d.Params.Samplers) == 0 {
		t.Errorf("params %+v", d.Params)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
