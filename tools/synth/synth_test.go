package synth

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
)

const gib = 1 << 30

func mustLookup(t *testing.T, name string) Preset {
	t.Helper()
	p, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func specByName(ts []TensorSpec) map[string]TensorSpec {
	m := make(map[string]TensorSpec, len(ts))
	for _, t := range ts {
		m[t.Name] = t
	}
	return m
}

func TestLookup(t *testing.T) {
	if _, err := Lookup("qwen3-14b"); err != nil {
		t.Fatal(err)
	}
	_, err := Lookup("qwen9")
	if err == nil || !strings.Contains(err.Error(), "qwen3-30b-a3b") || !strings.Contains(err.Error(), "tiny-llama") {
		t.Fatalf("error should list the presets, got %v", err)
	}
	if _, err := fileType("q4_0"); err == nil || !strings.Contains(err.Error(), "q4_k_m") {
		t.Fatalf("error should list the layouts, got %v", err)
	}
}

// Every preset in every layout has a consistent tensor list and metadata
// (planned, not written: the real presets are gigabytes).
func TestEveryPresetAndLayout(t *testing.T) {
	for _, p := range Presets() {
		for _, layout := range Layouts() {
			m, err := plan(Options{Preset: p.Name, Layout: layout})
			if err != nil {
				t.Fatalf("%s %s: %v", p.Name, layout, err)
			}
			specs, err := p.Tensors(layout)
			if err != nil {
				t.Fatal(err)
			}
			if len(specs) != len(m.infos) {
				t.Fatalf("%s %s: Tensors lists %d, plan %d", p.Name, layout, len(specs), len(m.infos))
			}
			seen := map[string]bool{}
			for i, s := range specs {
				if seen[s.Name] {
					t.Fatalf("%s: duplicate tensor %s", p.Name, s.Name)
				}
				seen[s.Name] = true
				if s.Type != m.infos[i].typ || !slices.Equal(s.Dims, m.infos[i].dims) {
					t.Fatalf("%s %s: %s differs between Tensors and plan", p.Name, layout, s.Name)
				}
				if len(s.Dims) == 1 && s.Type != gguf.TypeF32 {
					t.Errorf("%s %s: 1-D tensor %s is %s, want F32", p.Name, layout, s.Name, s.Type)
				}
				if strings.Contains(s.Name, "ffn_gate_inp") && s.Type != gguf.TypeF32 {
					t.Errorf("%s %s: router %s is %s, want F32", p.Name, layout, s.Name, s.Type)
				}
			}
			// Per layer: norms, Q/K/V/O and the FFN, plus the architecture's extras.
			perLayer := map[string]int{"qwen3": 11, "qwen3moe": 12, "glm4": 13, "llama": 9}[p.Arch]
			global := 3 // token_embd, output_norm, output
			if p.TiedEmbeddings {
				global--
			}
			if p.RopeScaling != nil {
				global++
			}
			if want := p.Layers*perLayer + global; len(specs) != want {
				t.Errorf("%s: %d tensors, want %d", p.Name, len(specs), want)
			}
			kv := map[string]gguf.Value{}
			for _, e := range m.kvs {
				kv[e.Key] = e.Value
			}
			a := p.Arch + "."
			want := map[string]any{
				"general.architecture":                 p.Arch,
				a + "block_count":                      uint32(p.Layers),
				a + "embedding_length":                 uint32(p.Hidden),
				a + "feed_forward_length":              uint32(p.FFN),
				a + "attention.head_count":             uint32(p.Heads),
				a + "attention.head_count_kv":          uint32(p.KVHeads),
				a + "attention.key_length":             uint32(p.HeadDim),
				a + "attention.value_length":           uint32(p.HeadDim),
				a + "rope.dimension_count":             uint32(p.RopeDim),
				a + "rope.freq_base":                   p.RopeBase,
				a + "attention.layer_norm_rms_epsilon": p.RMSEps,
				"general.quantization_version":         uint32(2),
				"general.file_type":                    map[string]uint32{"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15}[layout],
				"tokenizer.ggml.model":                 "llama",
				"tokenizer.ggml.bos_token_id":          uint32(1),
				"tokenizer.ggml.eos_token_id":          uint32(2),
				"tokenizer.ggml.unknown_token_id":      uint32(0),
				"tokenizer.ggml.add_bos_token":         !p.NoBOS,
			}
			if p.AddEOS {
				want["tokenizer.ggml.add_eos_token"] = true
			}
			if p.Pooling != 0 {
				want[a+"pooling_type"] = uint32(p.Pooling)
			} else if _, ok := kv[a+"pooling_type"]; ok {
				t.Errorf("%s: a pooling type in a generative model", p.Name)
			}
			if p.Experts > 0 {
				want[a+"expert_count"] = uint32(p.Experts)
				want[a+"expert_used_count"] = uint32(p.ExpertsUsed)
				want[a+"expert_feed_forward_length"] = uint32(p.ExpertFFN)
			}
			for k, w := range want {
				v, ok := kv[k]
				if !ok {
					t.Errorf("%s %s: no metadata %s", p.Name, layout, k)
				} else if !reflect.DeepEqual(v.Data(), w) {
					t.Errorf("%s %s: %s = %v, want %v", p.Name, layout, k, v.Data(), w)
				}
			}
			if n := kv["tokenizer.ggml.tokens"].Len(); n != p.Vocab {
				t.Errorf("%s: %d tokens, want %d", p.Name, n, p.Vocab)
			}
		}
	}
}

// The real presets have the real models' shapes; sizes agree with the
// baseline's llama.cpp figures and with published GGUF files.
func TestRealShapes(t *testing.T) {
	type shape struct {
		name string
		typ  gguf.Type
		dims []uint64
	}
	cases := []struct {
		preset, layout string
		gib            float64 // tensor data, ±0.005
		shapes         []shape
	}{
		{"qwen3-14b", "q4_k_m", 8.38, []shape{
			{"token_embd.weight", gguf.TypeQ4_K, dims(5120, 151936)},
			{"output.weight", gguf.TypeQ6_K, dims(5120, 151936)},
			{"blk.0.attn_q.weight", gguf.TypeQ4_K, dims(5120, 5120)},
			{"blk.0.attn_k.weight", gguf.TypeQ4_K, dims(5120, 1024)},
			{"blk.0.attn_v.weight", gguf.TypeQ6_K, dims(5120, 1024)}, // i < n/8
			{"blk.5.attn_v.weight", gguf.TypeQ4_K, dims(5120, 1024)},
			{"blk.7.ffn_down.weight", gguf.TypeQ6_K, dims(17408, 5120)}, // (7-5)%3 == 2
			{"blk.8.ffn_down.weight", gguf.TypeQ4_K, dims(17408, 5120)},
			{"blk.35.ffn_down.weight", gguf.TypeQ6_K, dims(17408, 5120)}, // i >= 7n/8
			{"blk.39.ffn_up.weight", gguf.TypeQ4_K, dims(5120, 17408)},
			{"blk.39.attn_q_norm.weight", gguf.TypeF32, dims(128)},
		}},
		// llama.cpp's baseline: 17.28 GiB.
		{"qwen3-30b-a3b", "q4_k_m", 17.28, []shape{
			{"blk.0.ffn_gate_inp.weight", gguf.TypeF32, dims(2048, 128)},
			{"blk.0.ffn_gate_exps.weight", gguf.TypeQ4_K, dims(2048, 768, 128)},
			{"blk.0.ffn_down_exps.weight", gguf.TypeQ6_K, dims(768, 2048, 128)},
			{"blk.6.ffn_down_exps.weight", gguf.TypeQ4_K, dims(768, 2048, 128)},
			{"blk.47.attn_output.weight", gguf.TypeQ4_K, dims(4096, 2048)},
			{"blk.47.attn_k.weight", gguf.TypeQ4_K, dims(2048, 512)},
		}},
		// Tied embeddings: llama.cpp's Q4_K_M gives the embedding the
		// output's Q6_K (published Qwen3-0.6B-Q4_K_M files are 397 MB).
		// The baseline's 0.33 GiB is this model with a Q4_K embedding.
		{"qwen3-0.6b", "q4_k_m", 0.364, []shape{
			{"token_embd.weight", gguf.TypeQ6_K, dims(1024, 151936)},
			{"blk.0.attn_q.weight", gguf.TypeQ4_K, dims(1024, 2048)},
			{"blk.0.attn_output.weight", gguf.TypeQ4_K, dims(2048, 1024)},
		}},
		{"qwen3-8b", "q4_k_m", 4.68, []shape{{"blk.0.ffn_up.weight", gguf.TypeQ4_K, dims(4096, 12288)}}},
		// GLM-4: Q/K/V biases, fused gate+up of 2x13696, post norms; ffn_down
		// rows (13696) are not whole 256-blocks, so llama.cpp falls back to
		// Q5_0 and Q8_0 (for Q6_K).
		{"glm4-9b", "q4_k_m", 5.73, []shape{
			{"blk.0.ffn_up.weight", gguf.TypeQ4_K, dims(4096, 27392)},
			{"blk.0.ffn_down.weight", gguf.TypeQ8_0, dims(13696, 4096)},
			{"blk.5.ffn_down.weight", gguf.TypeQ5_0, dims(13696, 4096)},
			{"blk.0.attn_k.weight", gguf.TypeQ4_K, dims(4096, 256)},
			{"blk.0.attn_k.bias", gguf.TypeF32, dims(256)},
			{"blk.0.attn_q.bias", gguf.TypeF32, dims(4096)},
			{"blk.0.post_attention_norm.weight", gguf.TypeF32, dims(4096)},
			{"blk.0.post_ffw_norm.weight", gguf.TypeF32, dims(4096)},
			{"output.weight", gguf.TypeQ6_K, dims(4096, 151552)},
		}},
		{"llama3-8b", "q4_k_m", 4.58, []shape{
			{"rope_freqs.weight", gguf.TypeF32, dims(64)},
			{"token_embd.weight", gguf.TypeQ4_K, dims(4096, 128256)},
			{"blk.31.ffn_down.weight", gguf.TypeQ6_K, dims(14336, 4096)},
			{"blk.0.attn_k.weight", gguf.TypeQ4_K, dims(4096, 1024)},
		}},
		{"qwen3-14b", "q8_0", 14.615, []shape{{"output.weight", gguf.TypeQ8_0, dims(5120, 151936)}}},
		{"qwen3-14b", "f16", 27.51, []shape{{"blk.0.attn_norm.weight", gguf.TypeF32, dims(5120)}}},
	}
	for _, c := range cases {
		p := mustLookup(t, c.preset)
		n, err := p.WeightBytes(c.layout)
		if err != nil {
			t.Fatal(err)
		}
		if got := float64(n) / gib; math.Abs(got-c.gib) > 0.005 {
			t.Errorf("%s %s: %.3f GiB of weights, want %.2f", c.preset, c.layout, got, c.gib)
		}
		specs, _ := p.Tensors(c.layout)
		byName := specByName(specs)
		for _, s := range c.shapes {
			got, ok := byName[s.name]
			if !ok {
				t.Errorf("%s: no tensor %s", c.preset, s.name)
			} else if got.Type != s.typ || !slices.Equal(got.Dims, s.dims) {
				t.Errorf("%s %s: %s is %s %v, want %s %v", c.preset, c.layout, s.name, got.Type, got.Dims, s.typ, s.dims)
			}
		}
	}
	if p := mustLookup(t, "qwen3-0.6b"); p.Params() < 590e6 || p.Params() > 600e6 {
		t.Errorf("qwen3-0.6b: %d params", p.Params())
	}
	if _, ok := specByName(mustSpecs(t, "qwen3-0.6b", "f16"))["output.weight"]; ok {
		t.Error("qwen3-0.6b has tied embeddings: no output.weight")
	}
}

func mustSpecs(t *testing.T, preset, layout string) []TensorSpec {
	t.Helper()
	s, err := mustLookup(t, preset).Tensors(layout)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Llama 3.1's rope factors as llama.cpp's converter computes them: 1 up to
// a wavelength of 2048, 8 from 8192, smooth between.
func TestRopeFreqs(t *testing.T) {
	f := mustLookup(t, "llama3-8b").ropeFreqs()
	if len(f) != 64 {
		t.Fatalf("%d factors", len(f))
	}
	for i, x := range f {
		switch {
		case i <= 28 && x != 1, i >= 35 && x != 8:
			t.Errorf("factor %d = %v", i, x)
		case i > 28 && i < 35 && !(x > f[i-1] && x < 8):
			t.Errorf("factor %d = %v, want between %v and 8", i, x, f[i-1])
		}
	}
}

// oracleDir finds testdata/oracle, or skips.
func oracleDir(t *testing.T) string {
	return filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
}

// Tiny presets, written in every layout, have the oracle files' tensor
// names, shapes and metadata, and the oracle's types where an oracle of
// that layout exists.
func TestTinyMatchesOracle(t *testing.T) {
	dir := oracleDir(t)
	tmp := t.TempDir()
	for _, preset := range []string{"tiny-qwen3", "tiny-qwen3moe", "tiny-glm4", "tiny-llama"} {
		oracles, _ := filepath.Glob(filepath.Join(dir, preset+"-*.gguf"))
		if len(oracles) == 0 {
			t.Fatalf("no oracle files for %s in %s", preset, dir)
		}
		for _, layout := range Layouts() {
			path := filepath.Join(tmp, preset+"-"+layout+".gguf")
			st, err := Write(path, Options{Preset: preset, Layout: layout, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			got, err := gguf.Open(path)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if fi, _ := os.Stat(path); fi.Size() != st.Bytes || st.Tensors != len(got.Tensors) {
				t.Errorf("%s: stats say %d bytes, %d tensors; file has %d, %d", path, st.Bytes, st.Tensors, fi.Size(), len(got.Tensors))
			}
			same := filepath.Join(dir, preset+"-"+layout+".gguf")
			for _, o := range oracles {
				want, err := gguf.Open(o)
				if err != nil {
					t.Fatal(err)
				}
				compareToOracle(t, preset+" "+layout+" vs "+filepath.Base(o), got, want, o == same)
				want.Close()
			}
			got.Close()
		}
	}
}

func compareToOracle(t *testing.T, what string, got, want *gguf.File, sameLayout bool) {
	t.Helper()
	if len(got.Tensors) != len(want.Tensors) {
		t.Errorf("%s: %d tensors, oracle %d", what, len(got.Tensors), len(want.Tensors))
	}
	for _, w := range want.Tensors {
		g, ok := got.Tensor(w.Name)
		switch {
		case !ok:
			t.Errorf("%s: no tensor %s", what, w.Name)
		case !slices.Equal(g.Dims, w.Dims):
			t.Errorf("%s: %s has dims %v, oracle %v", what, w.Name, g.Dims, w.Dims)
		case sameLayout && g.Type != w.Type:
			t.Errorf("%s: %s is %s, oracle %s", what, w.Name, g.Type, w.Type)
		}
	}
	// Same keys (the tiny-llama f32 oracle lacks general.quantization_version,
	// which llama.cpp's converter writes today); same values except the file type.
	for _, kv := range want.KVs {
		v, ok := got.Get(kv.Key)
		if !ok {
			t.Errorf("%s: no metadata %s", what, kv.Key)
			continue
		}
		if kv.Key == "general.file_type" && !sameLayout {
			continue
		}
		if v.Type != kv.Value.Type || v.Elem != kv.Value.Elem || !reflect.DeepEqual(v.Data(), kv.Value.Data()) {
			t.Errorf("%s: metadata %s = %.80s, oracle %.80s", what, kv.Key, v, kv.Value)
		}
	}
	for _, kv := range got.KVs {
		if !want.Has(kv.Key) && kv.Key != "general.quantization_version" {
			t.Errorf("%s: metadata %s is not in the oracle", what, kv.Key)
		}
	}
}

// checkValues dequantizes every tensor with package ops (an independent
// decoder) and checks that values are finite and have the planned
// distribution.
func checkValues(t *testing.T, what string, f *gguf.File, p Preset) {
	t.Helper()
	defs := map[string]tensorDef{}
	for _, d := range p.tensors() {
		defs[d.name] = d
	}
	for _, tn := range f.Tensors {
		def, ok := defs[tn.Name]
		if !ok {
			t.Fatalf("%s: unexpected tensor %s", what, tn.Name)
		}
		vals := dequantize(t, tn)
		var sum, sq float64
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, v := range vals {
			x := float64(v)
			if math.IsNaN(x) || math.IsInf(x, 0) {
				t.Fatalf("%s: %s holds %v", what, tn.Name, v)
			}
			sum += x
			sq += x * x
			lo, hi = min(lo, x), max(hi, x)
		}
		n := float64(len(vals))
		mean := sum / n
		std := math.Sqrt(max(sq/n-mean*mean, 0))
		if def.role == roleRopeFreqs {
			if !slices.Equal(vals, p.ropeFreqs()) {
				t.Errorf("%s: rope_freqs differ from the computed factors", what)
			}
			continue
		}
		d := distFor(def)
		tol := 5 * d.std / math.Sqrt(n) // the sample mean of a centred distribution
		if math.Abs(mean-d.mean) > tol+1e-3*d.std {
			t.Errorf("%s: %s (%s) mean %.3g, want %.3g ± %.2g", what, tn.Name, tn.Type, mean, d.mean, tol)
		}
		if math.Abs(std/d.std-1) > 0.1 {
			t.Errorf("%s: %s (%s) std %.4g, want %.4g ± 10%%", what, tn.Name, tn.Type, std, d.std)
		}
		if def.role == roleNorm && (lo < 0.899 || hi > 1.101) {
			t.Errorf("%s: %s norm weights span %v..%v, want 1 ± 0.1", what, tn.Name, lo, hi)
		}
	}
}

func dequantize(t *testing.T, tn *gguf.Tensor) []float32 {
	t.Helper()
	row := int(tn.Dims[0])
	rowBytes, err := tn.Type.RowBytes(uint64(row))
	if err != nil {
		t.Fatal(err)
	}
	rows := int(tn.Rows())
	out := make([]float32, row*rows)
	for r := range rows {
		src := tn.Data[uint64(r)*rowBytes : uint64(r+1)*rowBytes]
		if err := ops.DequantizeRow(tn.Type, out[r*row:(r+1)*row], src); err != nil {
			t.Fatalf("%s: %v", tn.Name, err)
		}
	}
	return out
}

func TestTinyValues(t *testing.T) {
	tmp := t.TempDir()
	for _, preset := range []string{"tiny-qwen3", "tiny-qwen3moe", "tiny-glm4", "tiny-llama"} {
		for _, layout := range Layouts() {
			path := filepath.Join(tmp, preset+"-"+layout+".gguf")
			if _, err := Write(path, Options{Preset: preset, Layout: layout, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			checkValues(t, preset+" "+layout, f, mustLookup(t, preset))
			f.Close()
		}
	}
}

// Every generator, including those only the big presets use (Q5_0 and Q8_0
// for GLM-4-9B's ffn_down, Q5_K for 8-expert models, Q5_1), decodes to
// centred values of the planned spread, for narrow and very wide rows (whose
// scales are f16 subnormals).
func TestGenerators(t *testing.T) {
	types := []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeQ8_0, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K}
	for _, typ := range types {
		for _, row := range []int{256, 17408, 65536} {
			def := tensorDef{name: "blk.0.ffn_down.weight", dims: dims(row, 64), role: roleMatrix, layer: 0}
			g, err := newGenerator(def, typ, Preset{})
			if err != nil {
				t.Fatal(err)
			}
			size, _ := typ.RowBytes(uint64(row * 64))
			data := make([]byte, size)
			r := rng{s: 42}
			g.fill(data, 0, &r)
			tn := &gguf.Tensor{TensorInfo: gguf.TensorInfo{Name: def.name, Type: typ, Dims: def.dims}, Data: data}
			vals := dequantize(t, tn)
			var sum, sq float64
			for _, v := range vals {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s row %d: %v", typ, row, v)
				}
				sum += float64(v)
				sq += float64(v) * float64(v)
			}
			n := float64(len(vals))
			want := 1 / math.Sqrt(float64(row))
			mean, std := sum/n, math.Sqrt(sq/n)
			if math.Abs(mean) > 5*want/math.Sqrt(n) {
				t.Errorf("%s row %d: mean %.3g (std %.3g)", typ, row, mean, want)
			}
			if math.Abs(std/want-1) > 0.05 {
				t.Errorf("%s row %d: std %.4g, want %.4g", typ, row, std, want)
			}
		}
	}
}

// The same seed gives the same bytes whatever the thread count and however
// the work is spread; another seed gives other bytes.
func TestDeterministic(t *testing.T) {
	defer func(c int) { chunkBytes = c }(chunkBytes)
	chunkBytes = 4096 // many chunks per tensor
	tmp := t.TempDir()
	write := func(name string, seed uint64, threads int) []byte {
		path := filepath.Join(tmp, name)
		if _, err := Write(path, Options{Preset: "tiny-qwen3moe", Layout: "q4_k_m", Seed: seed, Threads: threads}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := write("a.gguf", 3, 1)
	b := write("b.gguf", 3, 5)
	c := write("c.gguf", 4, 2)
	if !bytes.Equal(a, b) {
		t.Error("seed 3: 1 and 5 threads wrote different files")
	}
	if bytes.Equal(a, c) {
		t.Error("seeds 3 and 4 wrote the same file")
	}
	if _, err := os.Stat(filepath.Join(tmp, "a.gguf.tmp")); !os.IsNotExist(err) {
		t.Error("a.gguf.tmp left behind")
	}
}

// synth encodes the header itself (to stream tensors); rewriting a model
// through gguf.Writer must give the same bytes: header, offsets, padding.
func TestHeaderMatchesWriter(t *testing.T) {
	tmp := t.TempDir()
	for _, preset := range []string{"tiny-glm4", "tiny-llama"} {
		path := filepath.Join(tmp, preset+".gguf")
		opt := Options{Preset: preset, Layout: "q4_k_m"}
		if preset == "tiny-llama" {
			opt.Layout = "f16"
		}
		if _, err := Write(path, opt); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		w := gguf.NewWriter(&out)
		for _, kv := range f.KVs {
			w.Set(kv.Key, kv.Value)
		}
		for _, tn := range f.Tensors {
			if err := w.AddTensor(tn.Name, tn.Type, tn.Dims); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.WriteHeader(); err != nil {
			t.Fatal(err)
		}
		for _, tn := range f.Tensors {
			if err := w.WriteTensor(tn.Name, tn.Data); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		b, _ := os.ReadFile(path)
		if !bytes.Equal(out.Bytes(), b) {
			t.Errorf("%s: gguf.Writer writes %d bytes, synth %d, or they differ", preset, out.Len(), len(b))
		}
	}
}

func vocabFile(t *testing.T, name string) string {
	return filepath.Join(testenv.SharedDir(t), "testdata", "vocab", name)
}

// A real vocabulary: copied with its merges and chat template; padded to the
// preset's rows when smaller (Qwen3's tokenizer has 151669 tokens, the model
// 151936 rows), and the model grows when it is larger.
func TestVocabFile(t *testing.T) {
	qwen := vocabFile(t, "vocab-qwen3.gguf")
	m, err := plan(Options{Preset: "qwen3-14b", Vocab: qwen})
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]gguf.Value{}
	for _, e := range m.kvs {
		kv[e.Key] = e.Value
	}
	toks := kv["tokenizer.ggml.tokens"].Data().([]string)
	types := kv["tokenizer.ggml.token_type"].Data().([]int32)
	if len(toks) != 151936 || len(types) != 151936 || toks[151935] != "[PAD151935]" || types[151935] != tokUnused || toks[151668] == "[PAD151668]" {
		t.Errorf("padding: %d tokens, %d types, last %q (%d)", len(toks), len(types), toks[len(toks)-1], types[len(types)-1])
	}
	for _, k := range []string{"tokenizer.ggml.merges", "tokenizer.chat_template", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id"} {
		if _, ok := kv[k]; !ok {
			t.Errorf("%s not copied", k)
		}
	}
	if _, ok := kv["tokenizer.ggml.scores"]; ok {
		t.Error("a BPE vocabulary has no scores; none should be made up")
	}
	if len(m.notes) != 1 || !strings.Contains(m.notes[0], "padded") {
		t.Errorf("notes: %q", m.notes)
	}
	if got := m.infos[0].dims; !slices.Equal(got, dims(5120, 151936)) {
		t.Errorf("token_embd %v", got)
	}

	// Llama 3's tokenizer is exactly Llama 3.1's 128256 rows: nothing to say.
	m, err = plan(Options{Preset: "llama3-8b", Vocab: vocabFile(t, "vocab-llama3.gguf")})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.notes) != 0 {
		t.Errorf("llama3 notes: %q", m.notes)
	}

	// A tiny model with a real vocabulary: its vocab dimension follows the file.
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	st, err := Write(path, Options{Preset: "tiny-qwen3", Layout: "q8_0", Vocab: qwen})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "151669 rows") {
		t.Errorf("notes: %q", st.Notes)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, _ := gguf.Open(qwen)
	defer src.Close()
	for _, kv := range src.KVs {
		if !strings.HasPrefix(kv.Key, "tokenizer.") {
			continue
		}
		v, ok := f.Get(kv.Key)
		if !ok || !reflect.DeepEqual(v.Data(), kv.Value.Data()) {
			t.Errorf("%s not copied as is", kv.Key)
		}
	}
	for _, name := range []string{"token_embd.weight", "output.weight"} {
		if tn, _ := f.Tensor(name); !slices.Equal(tn.Dims, dims(256, 151669)) {
			t.Errorf("%s: %v", name, tn.Dims)
		}
	}
}

func TestMadeUpVocabUnique(t *testing.T) {
	kvs, err := madeUpVocab(151936)
	if err != nil {
		t.Fatal(err)
	}
	toks := kvs[1].Value.Data().([]string)
	seen := make(map[string]bool, len(toks))
	for _, s := range toks {
		if seen[s] || s == "" {
			t.Fatalf("token %q twice or empty", s)
		}
		seen[s] = true
	}
	if _, err := madeUpVocab(100); err == nil {
		t.Error("a 100-token made-up vocabulary cannot hold the byte tokens")
	}
}

func TestF16(t *testing.T) {
	for h := range 1 << 16 {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaN payloads
		}
		if got, want := f16ToF32(uint16(h)), ops.F16ToF32(uint16(h)); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("f16ToF32(%#04x) = %v, ops says %v", h, got, want)
		}
	}
	r := rng{s: 1}
	vals := []float32{0, 1, -1, 65504, 65520, 1e-8, 2.98e-8, 5.96e-8, 6.1e-5, 6.097e-5, 1.0009765, float32(math.Inf(1))}
	for range 200000 {
		x := r.next()
		vals = append(vals, math.Float32frombits(uint32(x)&0x8fffffff|0x30000000)) // ~1e-9..1e6
	}
	for _, v := range vals {
		if got, want := f32ToF16(v), ops.F32ToF16(v); got != want {
			t.Fatalf("f32ToF16(%v) = %#04x, ops says %#04x", v, got, want)
		}
	}
}

func TestNoMinus128(t *testing.T) {
	for _, c := range []struct{ in, want uint64 }{
		{0x8080808080808080, 0},
		{0x7f80017f00ff8081, 0x7f00017f00ff0081},
		{0x0102030405060708, 0x0102030405060708},
	} {
		if got := noMinus128(c.in); got != c.want {
			t.Errorf("noMinus128(%#x) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func ExampleWrite() {
	dir, _ := os.MkdirTemp("", "synth")
	defer os.RemoveAll(dir)
	st, err := Write(filepath.Join(dir, "tiny.gguf"), Options{Preset: "tiny-qwen3", Layout: "q8_0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(st.Tensors, st.Params)
	// Output: 36 3016832
}

// BenchmarkGenerate measures generation alone (no disk): the whole of a
// model streamed into io.Discard. The CLI's write speed is the disk's.
func BenchmarkGenerate(b *testing.B) {
	for _, c := range []struct{ preset, layout string }{{"qwen3-0.6b", "q4_k_m"}, {"qwen3-0.6b", "q8_0"}, {"qwen3-0.6b", "f16"}} {
		b.Run(c.preset+"-"+c.layout, func(b *testing.B) {
			m, err := plan(Options{Preset: c.preset, Layout: c.layout})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(m.header)) + int64(m.dataEnd))
			for b.Loop() {
				if err := m.stream(io.Discard, 1, 0, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// --pooling writes <arch>.pooling_type as llama.cpp numbers it, over the
// preset's; "none" leaves the key out; another name is refused. The
// embedding preset adds no BOS and appends EOS, whatever vocabulary it
// has.
func TestPooling(t *testing.T) {
	for _, tc := range []struct {
		preset, pooling string
		want            uint32 // 0: no key
	}{
		{"tiny-qwen3", "", 0},
		{"tiny-qwen3", "mean", 1},
		{"tiny-qwen3", "cls", 2},
		{"tiny-qwen3-embed", "", 3},
		{"tiny-qwen3-embed", "mean", 1},
		{"tiny-qwen3-embed", "none", 0},
	} {
		m, err := plan(Options{Preset: tc.preset, Layout: "f16", Pooling: tc.pooling})
		if err != nil {
			t.Fatal(err)
		}
		kv := map[string]gguf.Value{}
		for _, e := range m.kvs {
			kv[e.Key] = e.Value
		}
		v, ok := kv["qwen3.pooling_type"]
		switch {
		case tc.want == 0 && ok:
			t.Errorf("%s --pooling %q: pooling_type %v, want none", tc.preset, tc.pooling, v.Data())
		case tc.want != 0 && (!ok || v.Data() != tc.want):
			t.Errorf("%s --pooling %q: pooling_type %v (%v), want %d", tc.preset, tc.pooling, v, ok, tc.want)
		}
		embed := tc.preset == "tiny-qwen3-embed"
		if bos := kv["tokenizer.ggml.add_bos_token"]; bos.Data() != !embed {
			t.Errorf("%s: add_bos_token %v", tc.preset, bos.Data())
		}
		if eos, ok := kv["tokenizer.ggml.add_eos_token"]; ok != embed || ok && eos.Data() != true {
			t.Errorf("%s: add_eos_token %v (%v)", tc.preset, eos, ok)
		}
	}
	if _, err := plan(Options{Preset: "tiny-qwen3", Pooling: "max"}); err == nil || !strings.Contains(err.Error(), "none, mean, cls, last") {
		t.Errorf("--pooling max: %v", err)
	}
}

// --layers keeps the first blocks of a preset: block_count and the
// tensors follow, the shapes stay; a count out of range is refused.
func TestLayers(t *testing.T) {
	m, err := plan(Options{Preset: "qwen3-30b-a3b", Layers: 2})
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]bool{}
	for _, s := range m.infos {
		if rest, ok := strings.CutPrefix(s.name, "blk."); ok {
			blocks[rest[:strings.IndexByte(rest, '.')]] = true
		}
	}
	if len(blocks) != 2 || !blocks["0"] || !blocks["1"] {
		t.Errorf("blocks %v, want 0 and 1", blocks)
	}
	for _, e := range m.kvs {
		if e.Key == "qwen3moe.block_count" && e.Value.String() != "2" {
			t.Errorf("block_count %s, want 2", e.Value)
		}
	}
	for _, n := range []int{-1, 49} {
		if _, err := plan(Options{Preset: "qwen3-30b-a3b", Layers: n}); err == nil || !strings.Contains(err.Error(), "--layers") {
			t.Errorf("--layers %d: %v", n, err)
		}
	}
}

// --routing balanced: the routers read only the token's subspace, which
// nothing after the embedding writes, so every layer routes a token by its
// embedding, and random tokens spread over all the experts in every layer.
// Every other byte is the default file's.
func TestBalancedRouting(t *testing.T) {
	tmp := t.TempDir()
	p := mustLookup(t, "tiny-qwen3moe")
	for _, layout := range Layouts() {
		open := func(routing string) *gguf.File {
			path := filepath.Join(tmp, layout+"-"+routing+".gguf")
			if _, err := Write(path, Options{Preset: p.Name, Layout: layout, Seed: 3, Routing: routing}); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}
		def, bal := open(RoutingRandom), open(RoutingBalanced)
		if name, _ := bal.Get("general.name"); name.String() != "synthetic tiny-qwen3moe, balanced routing" {
			t.Errorf("%s: general.name %s", layout, name)
		}
		masked := 0
		for _, tn := range bal.Tensors {
			want, ok := def.Tensor(tn.Name)
			if !ok {
				t.Fatalf("%s: %s missing from the default file", layout, tn.Name)
			}
			kind := tn.Name[strings.LastIndexByte(strings.TrimSuffix(tn.Name, ".weight"), '.')+1 : len(tn.Name)-len(".weight")]
			rowBytes, _ := tn.Type.RowBytes(tn.Dims[0])
			switch kind {
			case "ffn_gate_inp": // F32 [hidden, experts]: columns past the subspace zero
				masked++
				for e := range int(tn.Dims[1]) {
					for d := range int(tn.Dims[0]) {
						got := tn.Data[(e*int(tn.Dims[0])+d)*4:][:4]
						if d < routeDims && !bytes.Equal(got, want.Data[(e*int(tn.Dims[0])+d)*4:][:4]) || d >= routeDims && !bytes.Equal(got, make([]byte, 4)) {
							t.Fatalf("%s %s: expert %d, column %d: % x", layout, tn.Name, e, d, got)
						}
					}
				}
			case "attn_output", "ffn_down_exps": // rows writing the subspace zero
				masked++
				vals := dequantize(t, tn)
				for r := range int(tn.Rows()) {
					row := tn.Data[uint64(r)*rowBytes:][:rowBytes]
					if r%int(tn.Dims[1]) >= routeDims {
						if !bytes.Equal(row, want.Data[uint64(r)*rowBytes:][:rowBytes]) {
							t.Fatalf("%s %s: row %d differs from the default file's", layout, tn.Name, r)
						}
						continue
					}
					for _, v := range vals[r*int(tn.Dims[0]):][:tn.Dims[0]] {
						if v != 0 {
							t.Fatalf("%s %s: row %d writes the token's subspace: %v", layout, tn.Name, r, v)
						}
					}
				}
			default:
				if !bytes.Equal(tn.Data, want.Data) {
					t.Fatalf("%s %s differs from the default file's", layout, tn.Name)
				}
			}
		}
		if masked != 3*p.Layers {
			t.Fatalf("%s: %d tensors masked, want %d", layout, masked, 3*p.Layers)
		}

		// A layer's routing: the top ExpertsUsed of router·(norm ⊙ x) over
		// the subspace, x the token's embedding there (the RMS norm's
		// positive factor changes no ranking).
		tensor := func(name string) *gguf.Tensor {
			tn, ok := bal.Tensor(name)
			if !ok {
				t.Fatalf("%s: no %s", layout, name)
			}
			return tn
		}
		emb := dequantize(t, tensor("token_embd.weight"))
		r := rng{s: 11}
		const tokens = 512
		for l := range p.Layers {
			router := dequantize(t, tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)))
			norm := dequantize(t, tensor(fmt.Sprintf("blk.%d.ffn_norm.weight", l)))
			counts := make([]int, p.Experts)
			for range tokens {
				x := emb[int(r.next()%uint64(p.Vocab))*p.Hidden:][:routeDims]
				logits := make([]float64, p.Experts)
				for e := range logits {
					for d, v := range x {
						logits[e] += float64(router[e*p.Hidden+d]) * float64(norm[d]) * float64(v)
					}
				}
				order := make([]int, p.Experts)
				for i := range order {
					order[i] = i
				}
				slices.SortFunc(order, func(a, b int) int { return cmp.Compare(logits[b], logits[a]) })
				for _, e := range order[:p.ExpertsUsed] {
					counts[e]++
				}
			}
			mean := tokens * p.ExpertsUsed / p.Experts
			for e, c := range counts {
				if c < mean/2 || c > 3*mean/2 {
					t.Errorf("%s layer %d: expert %d takes %d of %d slots (mean %d): %v", layout, l, e, c, tokens*p.ExpertsUsed, mean, counts)
					break
				}
			}
		}
	}
	for _, bad := range []Options{{Preset: "tiny-qwen3", Routing: RoutingBalanced}, {Preset: "tiny-qwen3moe", Routing: "even"}} {
		if _, err := plan(bad); err == nil || !strings.Contains(err.Error(), "--routing") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}
