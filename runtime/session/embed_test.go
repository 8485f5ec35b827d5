package session

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/atsinfer/ats/internal/oracletest"
	"github.com/atsinfer/ats/runtime/model"
)

// embedOracle is testdata/oracle/embed/NAME.embeddings.json: llama.cpp's
// llama-embedding on the model, its prompts in one batch (see the README
// there). Each of Last, LastRaw, Mean and CLS has a vector per prompt.
type embedOracle struct {
	Prompts    []string    `json:"prompts"`
	Tokens     [][]int     `json:"tokens"`      // the ids llama.cpp evaluated
	Last       [][]float32 `json:"last"`        // last-token pooling, unit length
	LastRaw    [][]float32 `json:"last_raw"`    // last-token pooling, as pooled
	Mean       [][]float32 `json:"mean"`        // mean pooling, unit length
	CLS        [][]float32 `json:"cls"`         // first-token pooling, unit length
	LastSingle [][]float32 `json:"last_single"` // Last, each prompt alone
}

const embedOracleName = "tiny-qwen3-embed-f16"

func loadEmbedOracle(t testing.TB) (*model.Model, *embedOracle) {
	t.Helper()
	m := oracletest.Open(t, filepath.Join("embed", embedOracleName))
	b, err := os.ReadFile(filepath.Join(oracletest.Dir(t), "embed", embedOracleName+".embeddings.json"))
	if err != nil {
		t.Fatal(err)
	}
	var o embedOracle
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return m, &o
}

// cosine is the cosine similarity of a and b, in float64.
func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

// The embedding bounds. ats and llama.cpp compute in float32 with f16
// weights and an f16 KV cache, in different orders, as for the logits
// oracles (whose bound for f16 weights is an NMSE of 1e-4): a vector of
// unit length whose NMSE against llama.cpp's is e has a cosine of 1-e/2,
// so 1e-4 is a cosine of 0.99995. llama.cpp itself moves a vector by a
// cosine distance of 1.4e-9 between a batch of prompts and a prompt alone.
const (
	embedMinCosine = 0.9999
	embedMaxNMSE   = 1e-4
)

// checkEmbedOracle embeds the oracle's prompts on an engine made with opt
// and compares every pooling with llama.cpp's vectors.
func checkEmbedOracle(t *testing.T, opt Options) {
	m, o := loadEmbedOracle(t)
	s, err := NewSession(m, opt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := FilePooling(m.File)
	if err != nil || p != PoolingLast {
		t.Fatalf("the file's pooling: %v %v, want last", p, err)
	}
	worst, worstNMSE := 1.0, 0.0
	for i, text := range o.Prompts {
		ids := s.EmbedTokens(text)
		if !slices.Equal(ids, o.Tokens[i]) {
			t.Fatalf("prompt %d %q: ats tokenizes it as %v, llama.cpp as %v", i, text, ids, o.Tokens[i])
		}
		for _, c := range []struct {
			name      string
			pooling   Pooling
			normalize bool
			want      []float32
		}{
			{"last", PoolingLast, true, o.Last[i]},
			{"last raw", PoolingLast, false, o.LastRaw[i]},
			{"mean", PoolingMean, true, o.Mean[i]},
			{"cls", PoolingCLS, true, o.CLS[i]},
		} {
			got, err := s.Engine.Embed(t.Context(), ids, c.pooling, c.normalize)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(c.want) {
				t.Fatalf("prompt %d %s: %d values, llama.cpp %d", i, c.name, len(got), len(c.want))
			}
			cos, e := cosine(got, c.want), nmse(got, c.want)
			worst, worstNMSE = min(worst, cos), max(worstNMSE, e)
			if cos < embedMinCosine || e > embedMaxNMSE {
				t.Errorf("prompt %d (%d tokens) %s: cosine %.7f, NMSE %.2e against llama.cpp; want at least %v and at most %v",
					i, len(ids), c.name, cos, e, embedMinCosine, embedMaxNMSE)
			}
		}
	}
	t.Logf("%d prompts, 4 poolings: worst cosine %.7f (1 - %.1e), worst NMSE %.1e", len(o.Prompts), worst, 1-worst, worstNMSE)
}

// TestEmbedOracle checks ats's embeddings on the CPU against llama.cpp's
// for a model shaped as Qwen3-Embedding: last-token pooling of the hidden
// state after the appended EOS, mean and first-token pooling, with and
// without normalisation; the prompts in one step each, and in steps of 16
// tokens (a prompt longer than a batch).
func TestEmbedOracle(t *testing.T) {
	t.Run("batch 512", func(t *testing.T) { checkEmbedOracle(t, Options{Threads: 2}) })
	t.Run("batch 16", func(t *testing.T) { checkEmbedOracle(t, Options{Threads: 2, Batch: 16}) })
}

// The oracle's batch and its prompts alone agree (what the bound allows
// for batching, llama.cpp's side).
func TestEmbedOracleBatching(t *testing.T) {
	_, o := loadEmbedOracle(t)
	for i := range o.Prompts {
		if c := cosine(o.Last[i], o.LastSingle[i]); c < 1-1e-8 {
			t.Errorf("prompt %d: llama.cpp's batch and the prompt alone differ: cosine %v", i, c)
		}
	}
}

// TestEmbedOracleGPU is TestEmbedOracle with every unit on the GPU, with
// each weight kernel variant; it skips without a GPU.
func TestEmbedOracleGPU(t *testing.T) {
	dev := needGPUDevice(t)
	for _, v := range gpuWeightVariants(dev) {
		t.Run(v.name, func(t *testing.T) {
			checkEmbedOracle(t, onGPU(dev, Options{DeviceOptions: v.opt}))
		})
	}
}
