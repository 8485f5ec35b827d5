package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// withVocab writes a copy of an oracle model whose tokenizer keeps only
// its first n tokens, while the embeddings keep all their rows.
func withVocab(t *testing.T, model string, n int) string {
	t.Helper()
	f, err := gguf.Open(oracleModel(t, model))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := f.Parts[0]
	for i, kv := range p.KVs {
		if !strings.HasPrefix(kv.Key, "tokenizer.ggml.") || kv.Value.Type != gguf.ValArray || kv.Key == "tokenizer.ggml.merges" {
			continue
		}
		switch a := kv.Value.Data().(type) {
		case []string:
			p.KVs[i].Value = gguf.MustArray(a[:n])
		case []float32:
			p.KVs[i].Value = gguf.MustArray(a[:n])
		case []int32:
			p.KVs[i].Value = gguf.MustArray(a[:n])
		}
	}
	path := filepath.Join(t.TempDir(), "short-vocab.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := f.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 33: a 100-token vocabulary with 512 rows of embeddings loaded
// silently, and ids 100-511 decoded to nothing. It is an error now, as in
// llama.cpp (the tensor's shape must match the vocabulary), naming both
// counts.
func TestVocabularyShorterThanEmbeddings(t *testing.T) {
	path := withVocab(t, "tiny-qwen3-f16", 100)
	_, _, err := runATSIn(t, "", "run", "-m", path, "-p", "hi", "-n", "2", "-t", "2", "-c", "256")
	if err == nil || !strings.Contains(err.Error(), "100 tokens") || !strings.Contains(err.Error(), "512 rows") {
		t.Fatalf("error %v, want one naming the 100 tokens and the 512 rows", err)
	}
	t.Log(err)
}
