// Command testdata writes the repository's testdata/ folder from the full
// set of fixtures (llama.cpp's oracle logits for small random-weight models,
// the models, and real tokenizers with llama.cpp's token ids) and the
// manifest that internal/testenv unpacks it by:
//
//	go run ./tools/testdata -from DIR    # DIR holds oracle/, oracle/long/, oracle/embed/ and vocab/
//
// What it keeps, packs and drops is decided here, in the tables below, so
// that the repository stays small (the tree is carried whole to the GPU
// machine) and still tests every architecture, weight type and tokenizer:
//   - logits JSON and vocabulary GGUF files are gzipped (a quarter to two
//     fifths of their size); quantized models do not compress and are kept
//     as they are;
//   - the bf16 model is stored as its difference from the f16 model of the
//     same weights rounded to bf16 (a few values in sixteen round the other
//     way, since llama.cpp rounded both from f32);
//   - byte-level BPE vocabularies keep every token (ids are unchanged) but
//     only the merges that can fire on the strings the tests tokenize with
//     them: a merge that never fires changes no result, and one that can
//     fires only on text that contains its two halves side by side;
//   - models that test nothing another model does not are left out (see
//     dropped).
//
// It checks what it wrote by unpacking it and comparing every file that
// was not trimmed with the original, byte for byte.
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
)

// models are the oracle models kept whole, each with its logits.
var models = []string{
	"tiny-glm4-q4_k_m",     // glm4; Q4_K with Q6_K
	"tiny-llama-q4_0",      // llama; Q4_0
	"tiny-llama-q8_0",      // llama; Q8_0
	"tiny-qwen3-f16",       // qwen3; F16, the tight bound; base of the bf16 model
	"tiny-qwen3-q4_k_m",    // qwen3; Q4_K with Q6_K; most tests use it
	"tiny-qwen3-q5_k_m",    // qwen3; Q5_K with Q6_K
	"tiny-qwen3moe-q4_k_m", // qwen3moe; experts in Q4_K and Q6_K, an F32 router
}

// bf16Models are kept as a difference from the f16 model named beside them.
var bf16Models = map[string]string{"tiny-qwen3-bf16": "tiny-qwen3-f16"}

// dropped are the oracle models left out, and why: each tests nothing that
// the kept ones do not, and together they are 28 MB.
var dropped = map[string]string{
	"tiny-llama-f32":     "10.5 MB of F32 weights: F32 products are covered by the MoE router and the ops tests, llama by the q8_0 and q4_0 models, the tight bound by f16 and bf16",
	"tiny-qwen3-q6_k":    "Q6_K is in every _k_m model (output, and attn_v and ffn_down of the last layer)",
	"tiny-glm4-q8_0":     "glm4 is tested by tiny-glm4-q4_k_m, Q8_0 by tiny-llama-q8_0",
	"tiny-qwen3moe-q8_0": "qwen3moe is tested by tiny-qwen3moe-q4_k_m, Q8_0 by tiny-llama-q8_0",
}

// longLogits are the long-context oracles (3000-token prompts), KV in f16,
// q8_0 and q4_0.
var longLogits = []string{"tiny-glm4-q4_k_m", "tiny-qwen3-f16", "tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m"}

// embedOracles are the embedding oracles (oracle/embed): a model with the
// vectors llama.cpp's llama-embedding computed for a few prompts, in
// several poolings.
var embedOracles = []string{"tiny-qwen3-embed-f16"} // qwen3, Qwen3-Embedding's tokenizer flags and last-token pooling; F16

// vocabs are the tokenizer fixtures.
var vocabs = []string{"gpt-2", "llama-spm", "llama3", "phi-3", "qwen3"}

// trimStrings are strings, beside each vocabulary's .inp cases and chat
// template, that tests tokenize with the real vocabularies and compare with
// fixed ids or counts; their merges are kept too.
var trimStrings = []string{
	"Hello world", // cmd/ats tokenize tests, the README's /tokenize example
	"Hi",          // cmd/ats TestTokenizeText
}

func main() {
	from := flag.String("from", "", "folder with the full fixtures: oracle/, oracle/long/, oracle/embed/, vocab/")
	out := flag.String("o", "testdata", "the testdata/ folder to write")
	flag.Parse()
	if *from == "" {
		fmt.Fprintln(os.Stderr, "testdata: -from is required (the folder that holds oracle/ and vocab/)")
		os.Exit(2)
	}
	if err := run(*from, *out); err != nil {
		fmt.Fprintln(os.Stderr, "testdata:", err)
		os.Exit(1)
	}
}

type writer struct {
	from, out string
	entries   []testenv.Entry
	exact     map[string]bool // unpacked files that must equal the originals
}

func run(from, out string) error {
	w := &writer{from: from, out: out, exact: map[string]bool{}}
	for _, m := range models {
		if err := w.copy("oracle/" + m + ".gguf"); err != nil {
			return err
		}
		if err := w.gzip("oracle/"+m+".logits.json", nil); err != nil {
			return err
		}
	}
	for m, base := range bf16Models {
		if err := w.bf16("oracle/"+m+".gguf", "oracle/"+base+".gguf"); err != nil {
			return err
		}
		if err := w.gzip("oracle/"+m+".logits.json", nil); err != nil {
			return err
		}
	}
	for _, m := range longLogits {
		for _, kv := range []string{"-long", "-long-kvq8", "-long-kvq4"} {
			if err := w.gzip("oracle/long/"+m+kv+".logits.json", nil); err != nil {
				return err
			}
		}
	}
	for _, m := range embedOracles {
		if err := w.copy("oracle/embed/" + m + ".gguf"); err != nil {
			return err
		}
		if err := w.gzip("oracle/embed/"+m+".embeddings.json", nil); err != nil {
			return err
		}
	}
	for _, v := range vocabs {
		name := "vocab/vocab-" + v
		for _, ext := range []string{".inp", ".out"} {
			if err := w.copy(name + ext); err != nil {
				return err
			}
		}
		if err := w.gzip(name+".gguf", trimVocab); err != nil {
			return err
		}
	}
	slices.SortStableFunc(w.entries, func(a, b testenv.Entry) int {
		// A bf16xor entry needs its base unpacked first: bases sort first
		// by kind, then by path.
		ka, kb := a.Op == testenv.OpBF16XOR, b.Op == testenv.OpBF16XOR
		switch {
		case ka && !kb:
			return 1
		case kb && !ka:
			return -1
		}
		return strings.Compare(a.Path, b.Path)
	})
	var mf strings.Builder
	mf.WriteString("# The files the tests read (paths under testdata/), the SHA-256 of each as\n" +
		"# the tests see it, and how internal/testenv makes it from the files stored\n" +
		"# here: copy (stored as it is), gunzip FILE, or bf16xor BASE FILE (BASE\n" +
		"# rounded from f16 to bf16 word by word, XOR the gunzipped FILE).\n" +
		"# Written by go run ./tools/testdata; see README.md.\n")
	for _, e := range w.entries {
		mf.WriteString(e.String() + "\n")
	}
	if err := os.WriteFile(filepath.Join(out, testenv.ManifestName), []byte(mf.String()), 0o644); err != nil {
		return err
	}
	return w.verify()
}

func (w *writer) src(p string) string { return filepath.Join(w.from, filepath.FromSlash(p)) }
func (w *writer) dst(p string) string { return filepath.Join(w.out, filepath.FromSlash(p)) }

func (w *writer) write(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(w.dst(p)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(w.dst(p), b, 0o644)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func (w *writer) copy(p string) error {
	b, err := os.ReadFile(w.src(p))
	if err != nil {
		return err
	}
	w.entries = append(w.entries, testenv.Entry{SHA256: sum(b), Path: p, Op: testenv.OpCopy})
	w.exact[p] = true
	return w.write(p, b)
}

// gzip stores p gzipped, after transform when it is given (nil: as is).
func (w *writer) gzip(p string, transform func(p string, b []byte) ([]byte, error)) error {
	b, err := os.ReadFile(w.src(p))
	if err != nil {
		return err
	}
	w.exact[p] = transform == nil
	if transform != nil {
		if b, err = transform(w.src(p), b); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	z, err := gzipBytes(b)
	if err != nil {
		return err
	}
	w.entries = append(w.entries, testenv.Entry{SHA256: sum(b), Path: p, Op: testenv.OpGunzip, Args: []string{p + ".gz"}})
	return w.write(p+".gz", z)
}

func (w *writer) bf16(p, base string) error {
	b, err := os.ReadFile(w.src(p))
	if err != nil {
		return err
	}
	bb, err := os.ReadFile(w.src(base))
	if err != nil {
		return err
	}
	if len(b) != len(bb) {
		return fmt.Errorf("%s and %s differ in size (%d and %d bytes): a word-by-word difference needs the same layout", p, base, len(b), len(bb))
	}
	delta := testenv.RoundedBF16(bb)
	for i := range delta {
		delta[i] ^= b[i]
	}
	z, err := gzipBytes(delta)
	if err != nil {
		return err
	}
	stored := p + ".bf16xor.gz"
	w.entries = append(w.entries, testenv.Entry{SHA256: sum(b), Path: p, Op: testenv.OpBF16XOR, Args: []string{base, stored}})
	w.exact[p] = true
	return w.write(stored, z)
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	z, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := z.Write(b); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// verify unpacks what was written and compares the untrimmed files with
// the originals.
func (w *writer) verify() error {
	tmp, err := os.MkdirTemp("", "ats-testdata-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir, err := testenv.Unpack(w.out, tmp)
	if err != nil {
		return err
	}
	var total int64
	stored, err := testenv.WalkStored(w.out)
	if err != nil {
		return err
	}
	for _, p := range stored {
		if st, err := os.Stat(w.dst(p)); err == nil {
			total += st.Size()
		}
	}
	for _, e := range w.entries {
		got, err := os.ReadFile(filepath.Join(dir, "testdata", filepath.FromSlash(e.Path)))
		if err != nil {
			return err
		}
		if w.exact[e.Path] {
			want, err := os.ReadFile(w.src(e.Path))
			if err != nil {
				return err
			}
			if !bytes.Equal(got, want) {
				return fmt.Errorf("%s unpacks to other bytes than %s", e.Path, w.src(e.Path))
			}
		}
	}
	fmt.Printf("wrote %d files (%.1f MB stored) for %d test files; unpacked and checked\n", len(stored), float64(total)/1e6, len(w.entries))
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range dropped {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Printf("left out %s: %s\n", name, dropped[name])
	}
	return nil
}

// trimVocab keeps the merges of a byte-level BPE vocabulary that can fire
// on the strings the tests tokenize with it; other vocabularies pass
// unchanged.
func trimVocab(p string, b []byte) ([]byte, error) {
	f, err := gguf.Parse(p, b)
	if err != nil {
		return nil, err
	}
	model, _ := f.String("tokenizer.ggml.model")
	if model != "gpt2" {
		return b, nil
	}
	merges, err := f.Strings("tokenizer.ggml.merges")
	if err != nil {
		return nil, err
	}
	inp, err := os.ReadFile(strings.TrimSuffix(p, ".gguf") + ".inp")
	if err != nil {
		return nil, err
	}
	corpus := slices.Clone(trimStrings)
	corpus = append(corpus, strings.Split(string(inp), "\n__ggml_vocab_test__\n")...)
	if tmpl, err := f.String("tokenizer.chat_template"); err == nil {
		corpus = append(corpus, tmpl)
	}
	text := []byte(strings.Join(corpus, "\x00"))
	var kept []string
	for _, m := range merges {
		j := strings.IndexByte(m[1:], ' ')
		if j < 0 {
			kept = append(kept, m)
			continue
		}
		raw, ok := fromByteLevel(m[:j+1] + m[j+2:])
		if !ok || bytes.Contains(text, raw) {
			kept = append(kept, m)
		}
	}
	fmt.Printf("%s: kept %d of %d merges\n", p, len(kept), len(merges))
	gw := new(bytes.Buffer)
	out := gguf.NewWriter(gw)
	for _, kv := range f.KVs {
		v := kv.Value
		if kv.Key == "tokenizer.ggml.merges" {
			if v, err = gguf.Array(kept); err != nil {
				return nil, err
			}
		}
		out.Set(kv.Key, v)
	}
	if len(f.Tensors) != 0 {
		return nil, fmt.Errorf("a vocabulary file with %d tensors: only vocabulary-only files are trimmed", len(f.Tensors))
	}
	if err := out.WriteHeader(); err != nil {
		return nil, err
	}
	if err := out.Close(); err != nil {
		return nil, err
	}
	return gw.Bytes(), nil
}

// byteLevel maps GPT-2's byte-level characters back to the bytes they
// stand for: printable bytes stand for themselves, the others for U+0100
// upward in byte order.
var byteLevel = func() map[rune]byte {
	m := map[rune]byte{}
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff) {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}()

func fromByteLevel(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := byteLevel[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
