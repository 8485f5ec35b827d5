package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/atsinfer/ats/internal/testenv"
)

// The embeddings endpoints against llama.cpp: the oracle in
// testdata/oracle/embed is a model shaped as Qwen3-Embedding (last-token
// pooling of the EOS its tokenizer appends) with the vectors llama.cpp's
// llama-embedding computed for a few prompts in one batch. The engine's
// own test (runtime/session) says how close they are and why; here the
// same bound holds for what each endpoint returns.

const embedModel = "embed/tiny-qwen3-embed-f16.gguf"

type embedOracle struct {
	Prompts []string    `json:"prompts"`
	Tokens  [][]int     `json:"tokens"`
	Last    [][]float32 `json:"last"`
	Mean    [][]float32 `json:"mean"`
}

func loadEmbedOracle(t testing.TB) *embedOracle {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "embed", "tiny-qwen3-embed-f16.embeddings.json"))
	if err != nil {
		t.Fatal(err)
	}
	var o embedOracle
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return &o
}

// checkVector fails the test unless got is llama.cpp's want within the
// engine test's bound: cosine at least 0.9999, NMSE at most 1e-4.
func checkVector[F float32 | float64](t testing.TB, what string, got []F, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, llama.cpp %d", what, len(got), len(want))
	}
	var ab, aa, bb, d2 float64
	for i := range want {
		a, b := float64(got[i]), float64(want[i])
		ab, aa, bb, d2 = ab+a*b, aa+a*a, bb+b*b, d2+(a-b)*(a-b)
	}
	if cos, nmse := ab/math.Sqrt(aa*bb), d2/bb; cos < 0.9999 || nmse > 1e-4 {
		t.Errorf("%s: cosine %.7f, NMSE %.2e against llama.cpp", what, cos, nmse)
	}
}

func TestEmbeddingsMatchLlamaCpp(t *testing.T) {
	o := loadEmbedOracle(t)
	ts := startServerModel(t, embedModel, 512, Config{Embeddings: true}) // the pooling the file names: last
	ctx := context.Background()
	tokens := 0
	for _, ids := range o.Tokens {
		tokens += len(ids)
	}

	// OpenAI's client, the prompts in one request.
	resp, err := ts.client.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "tiny",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: o.Prompts}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Data) != len(o.Prompts) || resp.Usage.PromptTokens != int64(tokens) {
		t.Fatalf("%d vectors, %d prompt tokens; want %d and %d (llama.cpp's token count, EOS included)", len(resp.Data), resp.Usage.PromptTokens, len(o.Prompts), tokens)
	}
	for i, d := range resp.Data {
		if d.Index != int64(i) {
			t.Errorf("data[%d] has index %d", i, d.Index)
		}
		checkVector(t, "/v1/embeddings input "+o.Prompts[i], d.Embedding, o.Last[i])
	}

	// Token ids in, as llama.cpp evaluated them; base64 out.
	code, out := postJSON(t, ts.url, "/v1/embeddings", map[string]any{"input": o.Tokens, "encoding_format": "base64"})
	if code != 200 {
		t.Fatalf("token ids: %d %v", code, out)
	}
	for i, d := range out["data"].([]any) {
		raw, err := base64.StdEncoding.DecodeString(d.(map[string]any)["embedding"].(string))
		if err != nil || len(raw) != 4*len(o.Last[i]) {
			t.Fatalf("base64 vector %d: %d bytes, %v", i, len(raw), err)
		}
		v := make([]float32, len(raw)/4)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
		checkVector(t, "/v1/embeddings token ids, base64", v, o.Last[i])
	}

	// ollama's /api/embed, the prompts in one request, and the older
	// /api/embeddings, one prompt.
	c := ollamaClient(t, ts)
	emb, err := c.Embed(ctx, &api.EmbedRequest{Model: "tiny", Input: o.Prompts})
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Embeddings) != len(o.Prompts) || emb.PromptEvalCount != tokens {
		t.Fatalf("/api/embed: %d vectors, %d tokens", len(emb.Embeddings), emb.PromptEvalCount)
	}
	for i, v := range emb.Embeddings {
		checkVector(t, "/api/embed input "+o.Prompts[i], v, o.Last[i])
	}
	old, err := c.Embeddings(ctx, &api.EmbeddingRequest{Model: "tiny", Prompt: o.Prompts[2]})
	if err != nil {
		t.Fatal(err)
	}
	checkVector(t, "/api/embeddings", old.Embedding, o.Last[2])
}

// --pooling mean overrides the file's last-token pooling.
func TestEmbeddingsMeanPooling(t *testing.T) {
	o := loadEmbedOracle(t)
	ts := startServerModel(t, embedModel, 512, Config{Embeddings: true, Pooling: "mean"})
	resp, err := ts.client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "tiny",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: o.Prompts}})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range resp.Data {
		checkVector(t, "mean pooling, input "+o.Prompts[i], d.Embedding, o.Mean[i])
	}
}

// A server for last-token embeddings warns when the tokenizer appends no
// EOS (as llama.cpp does): the model would be pooled at its last text
// token, not at the EOS it was trained to summarise the text in.
func TestEmbeddingsWarnWithoutEOS(t *testing.T) {
	for _, tc := range []struct {
		model string
		warn  bool
	}{{embedModel, false}, {"tiny-qwen3-q4_k_m.gguf", true}} {
		var log bytes.Buffer
		startServerModel(t, tc.model, 512, Config{Embeddings: true, Pooling: "last", Log: slog.New(slog.NewTextHandler(&log, nil))})
		if got := strings.Contains(log.String(), "appends no EOS"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v: %s", tc.model, got, tc.warn, log.String())
		}
	}
}
