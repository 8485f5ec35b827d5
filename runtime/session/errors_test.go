package session

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
)

// rewrite copies an oracle model through the GGUF writer, letting edit
// change metadata and tensors on the way, and returns the new file's path.
func rewrite(t *testing.T, src string, edit func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo) string {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := map[string]gguf.Value{}
	for _, e := range f.KVs {
		kv[e.Key] = e.Value
	}
	var infos []gguf.TensorInfo
	for _, tn := range f.Tensors {
		infos = append(infos, tn.TensorInfo)
	}
	infos = edit(kv, infos)
	path := filepath.Join(t.TempDir(), "edited.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := gguf.NewWriter(out)
	for _, e := range f.KVs {
		if v, ok := kv[e.Key]; ok {
			w.Set(e.Key, v)
		}
	}
	data := map[string][]byte{}
	for _, ti := range infos {
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims); err != nil {
			t.Fatal(err)
		}
		size, _ := ti.Type.RowBytes(ti.Dims[0])
		for _, d := range ti.Dims[1:] {
			size *= d
		}
		b := make([]byte, size)
		if orig, ok := f.Tensor(ti.Name); ok {
			copy(b, orig.Data)
		}
		data[ti.Name] = b
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	for name, ok := w.Next(); ok; name, ok = w.Next() {
		if err := w.WriteTensor(name, data[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBadModels(t *testing.T) {
	src := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3-q4_k_m.gguf")
	cases := []struct {
		name string
		edit func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo
		want []string // substrings of the error
	}{
		{"unknown architecture", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			kv["general.architecture"] = gguf.String("mamba9")
			return infos
		}, []string{`unsupported architecture "mamba9"`, "qwen3", "llama", "glm4"}},
		{"missing hyperparameter", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			delete(kv, "qwen3.block_count")
			return infos
		}, []string{`"qwen3.block_count"`}},
		{"wrong shape", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			for i := range infos {
				if infos[i].Name == "blk.1.attn_k.weight" {
					infos[i].Dims = []uint64{256, 256}
				}
			}
			return infos
		}, []string{`"blk.1.attn_k.weight"`, "shape [256 256]"}},
		{"missing tensor", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			var out []gguf.TensorInfo
			for _, ti := range infos {
				if ti.Name != "blk.2.ffn_up.weight" {
					out = append(out, ti)
				}
			}
			return out
		}, []string{`missing tensor "blk.2.ffn_up.weight"`}},
		{"unsupported weight type", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			for i := range infos {
				if infos[i].Name == "blk.0.ffn_gate.weight" {
					infos[i].Type = gguf.TypeIQ4_NL
				}
			}
			return infos
		}, []string{`"blk.0.ffn_gate.weight"`, "IQ4_NL", "Q4_K"}},
		{"bad head counts", func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
			kv["qwen3.attention.head_count_kv"] = gguf.Uint32(3)
			return infos
		}, []string{"not a multiple of 3 KV heads"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The file's structure is checked when it opens, the weights'
			// types when an engine is made for it.
			m, err := model.Open(rewrite(t, src, tc.edit))
			if err == nil {
				var e *Engine
				e, err = NewEngine(m, Options{CtxSize: 16, Threads: 1})
				if err == nil {
					e.Close()
					t.Fatal("Open and NewEngine succeeded")
				}
				m.Close()
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestEvalErrors(t *testing.T) {
	m, err := model.Open(filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-llama-q8_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := newCtx(m, Options{CtxSize: 8, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Eval([]int{1, 512}, false); err == nil || !strings.Contains(err.Error(), "outside the vocabulary of 512") {
		t.Errorf("token 512: got %v", err)
	}
	if _, err := c.Eval([]int{1, -1}, false); err == nil {
		t.Error("token -1 accepted")
	}
	if _, err := c.Eval(nil, false); err == nil {
		t.Error("empty batch accepted")
	}
	if _, err := c.Eval([]int{1, 2, 3, 4, 5, 6}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Eval([]int{1, 2, 3}, false); !errors.Is(err, ErrContextFull) {
		t.Errorf("past the context: got %v, want ErrContextFull", err)
	}
	if c.Pos() != 6 {
		t.Errorf("a failed eval moved the position to %d", c.Pos())
	}
	if err := c.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Eval([]int{1, 2, 3}, false); err != nil {
		t.Errorf("after truncate: %v", err)
	}
}

// TestHyperChecks covers hostile hyperparameters: non-finite or
// non-positive norm epsilon and rope base, and a block_count past the
// file's blocks.
func TestHyperChecks(t *testing.T) {
	src := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3-q4_k_m.gguf")
	if _, err := os.Stat(src); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		val  any
		want string
	}{
		{"qwen3.attention.layer_norm_rms_epsilon", float32(0), "layer_norm_rms_epsilon is 0"},
		{"qwen3.attention.layer_norm_rms_epsilon", float32(-1e-6), "must be a finite number above 0"},
		{"qwen3.attention.layer_norm_rms_epsilon", nan32(), "NaN"},
		{"qwen3.rope.freq_base", inf32(), "+Inf"},
		{"qwen3.rope.freq_base", float32(0), "rope.freq_base is 0"},
		{"qwen3.block_count", uint32(1_000_000), "block_count is 1000000 but the file's tensors stop at block 2"},
	} {
		path := rewriteKV(t, src, c.key, c.val)
		_, err := model.Open(path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s = %v: error %v, want one saying %q", c.key, c.val, err, c.want)
		}
	}
}

// rewriteKV copies an oracle model with one metadata value replaced.
func rewriteKV(t *testing.T, src, key string, val any) string {
	t.Helper()
	return rewrite(t, src, func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
		switch v := val.(type) {
		case float32:
			kv[key] = gguf.Float32(v)
		case uint32:
			kv[key] = gguf.Uint32(v)
		default:
			t.Fatalf("rewriteKV: %T", val)
		}
		return infos
	})
}

func nan32() float32 { return float32(math.NaN()) }
func inf32() float32 { return float32(math.Inf(1)) }
