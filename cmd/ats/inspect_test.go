package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
)

// runInspect runs the inspect command in-process and returns its output.
func runInspect(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newInspectCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func inspectSharedFiles(t *testing.T) []string {
	d := testenv.SharedDir(t)
	var files []string
	for _, sub := range []string{"oracle", "vocab"} {
		m, _ := filepath.Glob(filepath.Join(d, "testdata", sub, "*.gguf"))
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatalf("no .gguf files under %s/testdata", d)
	}
	return files
}

// inspectJSON is the part of the JSON report the tests decode.
type inspectJSON struct {
	Path            string           `json:"path"`
	GGUFVersion     uint32           `json:"gguf_version"`
	SizeBytes       int64            `json:"size_bytes"`
	Parts           int              `json:"parts"`
	PartPaths       []string         `json:"part_paths"`
	Architecture    string           `json:"architecture"`
	Name            string           `json:"name"`
	ParameterCount  uint64           `json:"parameter_count"`
	Parameters      string           `json:"parameters"`
	FileType        *inspectFileType `json:"file_type"`
	Hyperparameters map[string]any   `json:"hyperparameters"`
	Tokenizer       *struct {
		Model         string                  `json:"model"`
		VocabSize     int                     `json:"vocab_size"`
		MergesCount   int                     `json:"merges_count"`
		SpecialTokens map[string]inspectToken `json:"special_tokens"`
	} `json:"tokenizer"`
	ChatTemplate inspectChatTemplate `json:"chat_template"`
	Metadata     []inspectKV         `json:"metadata"`
	TensorCount  int                 `json:"tensor_count"`
	TensorBytes  uint64              `json:"tensor_bytes"`
	Tensors      []inspectTensor     `json:"tensors"`
	Types        []inspectTypeTotal  `json:"types"`
}

// wantFields are the top-level JSON fields scripts may rely on.
var wantFields = []string{
	"path", "gguf_version", "size_bytes", "parts", "part_paths", "alignment",
	"architecture", "name", "parameter_count", "parameters", "file_type",
	"hyperparameters", "tokenizer", "chat_template", "metadata",
	"tensor_count", "tensor_bytes", "tensors", "types",
}

// checkAgainstGGUF compares a JSON report with what package gguf reads.
func checkAgainstGGUF(t *testing.T, path string, out string, f *gguf.File) {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &fields); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	for _, k := range wantFields {
		if _, ok := fields[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if string(fields["tensors"]) == "null" {
		t.Error(`"tensors" is null although the table was asked for`)
	}
	var r inspectJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Path != path || r.GGUFVersion != f.Version() || r.SizeBytes != f.Size() || r.Parts != len(f.Parts) || len(r.PartPaths) != len(f.Parts) {
		t.Errorf("path %s v%d %d bytes %d parts, want %s v%d %d bytes %d parts", r.Path, r.GGUFVersion, r.SizeBytes, r.Parts, path, f.Version(), f.Size(), len(f.Parts))
	}
	if a, _ := f.Arch(); r.Architecture != a {
		t.Errorf("architecture %q, want %q", r.Architecture, a)
	}
	if r.TensorCount != len(f.Tensors) || len(r.Tensors) != len(f.Tensors) {
		t.Fatalf("%d tensors (%d listed), want %d", r.TensorCount, len(r.Tensors), len(f.Tensors))
	}
	var params, bytes uint64
	perType := map[string]int{}
	for i, ft := range f.Tensors {
		rt := r.Tensors[i]
		if rt.Name != ft.Name || rt.Type != ft.Type.String() || !reflect.DeepEqual(rt.Shape, ft.Dims) || rt.Bytes != ft.Size || rt.Part != ft.Part+1 {
			t.Errorf("tensor %d: %+v, want %s %s %v %d part %d", i, rt, ft.Name, ft.Type, ft.Dims, ft.Size, ft.Part+1)
		}
		params += ft.Elements()
		bytes += ft.Size
		perType[ft.Type.String()]++
	}
	if r.ParameterCount != params || r.TensorBytes != bytes {
		t.Errorf("parameters %d, bytes %d; want %d, %d", r.ParameterCount, r.TensorBytes, params, bytes)
	}
	var share float64
	for _, tt := range r.Types {
		if perType[tt.Type] != tt.Count {
			t.Errorf("type %s: %d tensors, want %d", tt.Type, tt.Count, perType[tt.Type])
		}
		delete(perType, tt.Type)
		share += tt.Share
	}
	if len(perType) != 0 {
		t.Errorf("types missing from the totals: %v", perType)
	}
	if len(r.Types) > 0 && math.Abs(share-1) > 1e-9 {
		t.Errorf("shares add up to %v", share)
	}
	// Every "<arch>." key is a hyperparameter.
	for _, kv := range f.KVs {
		if name, ok := strings.CutPrefix(kv.Key, r.Architecture+"."); ok && r.Architecture != "" {
			if _, ok := r.Hyperparameters[name]; !ok {
				t.Errorf("hyperparameter %s missing", kv.Key)
			}
		}
	}
	if tokens, err := f.Strings("tokenizer.ggml.tokens"); err == nil {
		if r.Tokenizer == nil || r.Tokenizer.VocabSize != len(tokens) {
			t.Fatalf("tokenizer %+v, want %d tokens", r.Tokenizer, len(tokens))
		}
		if id, err := f.Int("tokenizer.ggml.bos_token_id"); err == nil {
			if bos := r.Tokenizer.SpecialTokens["bos"]; bos.ID != id || bos.Text != tokens[id] || !bos.Valid {
				t.Errorf("bos %+v, want %d %q", bos, id, tokens[id])
			}
		}
	}
	if tmpl, err := f.String("tokenizer.chat_template"); err == nil {
		if !r.ChatTemplate.Present || r.ChatTemplate.Bytes != len(tmpl) {
			t.Errorf("chat template %+v, want %d bytes", r.ChatTemplate, len(tmpl))
		}
	} else if r.ChatTemplate.Present {
		t.Error("chat template reported present")
	}
	// Metadata keys are each shown once: in a section or in "metadata".
	for _, kv := range r.Metadata {
		if strings.HasPrefix(kv.Key, r.Architecture+".") && r.Architecture != "" {
			t.Errorf("%s is listed as other metadata", kv.Key)
		}
	}
}

func TestInspectShared(t *testing.T) {
	for _, path := range inspectSharedFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			out, err := runInspect(t, path, "--json")
			if err != nil {
				t.Fatal(err)
			}
			checkAgainstGGUF(t, path, out, f)

			text, err := runInspect(t, path)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"path:", path, "gguf version:", "parameters:", "file type:", "chat template:"} {
				if !strings.Contains(text, want) {
					t.Errorf("text output lacks %q", want)
				}
			}
			if a, err := f.Arch(); err == nil && !strings.Contains(text, "architecture:  "+a) {
				t.Errorf("text output lacks the architecture %q", a)
			}
			// Columns are separated by two or more spaces.
			cols := regexp.MustCompile(` {2,}`).ReplaceAllString(text, "|")
			for _, tn := range f.Tensors {
				row := fmt.Sprintf("|%s|%s|%s|%d\n", tn.Name, tn.Type, inspShape(tn.Dims), tn.Size)
				if !strings.Contains(cols, row) {
					t.Errorf("text output lacks the row %q", row)
					break
				}
			}
			if len(f.Tensors) == 0 && !strings.Contains(text, "tensors:  none") {
				t.Error("text output does not say there are no tensors")
			}
		})
	}
}

func TestInspectNoTensors(t *testing.T) {
	path := inspectSharedFiles(t)[0]
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) == 0 {
		t.Skip("first shared file has no tensors")
	}
	text, err := runInspect(t, path, "--tensors=false")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text, f.Tensors[0].Name) || !strings.Contains(text, "totals by type") {
		t.Errorf("--tensors=false: tensor table shown or totals missing:\n%s", text)
	}
	out, err := runInspect(t, path, "--json", "--tensors=false")
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if string(r["tensors"]) != "null" || len(r["types"]) < 3 {
		t.Errorf("--json --tensors=false: tensors %s, types %s", r["tensors"], r["types"])
	}
}

func TestInspectSplit(t *testing.T) {
	files := inspectSharedFiles(t)
	src, err := gguf.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if len(src.Tensors) < 3 {
		t.Skip("first shared file has fewer than 3 tensors")
	}
	paths, err := src.WriteSplit(filepath.Join(t.TempDir(), "split"), 3)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := runInspect(t, paths[0], "--json")
	if err != nil {
		t.Fatal(err)
	}
	checkAgainstGGUF(t, paths[0], out, f)
	var r inspectJSON
	json.Unmarshal([]byte(out), &r)
	if r.Parts != 3 || r.TensorCount != len(src.Tensors) {
		t.Errorf("split: %d parts, %d tensors; want 3, %d", r.Parts, r.TensorCount, len(src.Tensors))
	}
	// The split keys are metadata like any other; the model's own
	// hyperparameters still come from the first part.
	text, err := runInspect(t, paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "parts:         3") || !strings.Contains(text, "split.count") || !strings.Contains(text, "PART") {
		t.Errorf("split text output:\n%s", text)
	}
}

func TestInspectErrors(t *testing.T) {
	files := inspectSharedFiles(t)
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.gguf")
	if err := os.WriteFile(cut, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = runInspect(t, cut)
	var pe *gguf.ParseError
	if !errors.As(err, &pe) || pe.File != cut || !strings.Contains(err.Error(), "offset") || !strings.Contains(err.Error(), pe.Field) {
		t.Errorf("truncated file: %v", err)
	}
	header := filepath.Join(dir, "header.gguf")
	os.WriteFile(header, b[:200], 0o644)
	if _, err := runInspect(t, header, "--json"); !errors.As(err, &pe) {
		t.Errorf("file cut in its header: %v", err)
	}
	if _, err := runInspect(t, filepath.Join(dir, "missing.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := runInspect(t); err == nil {
		t.Error("no argument accepted")
	}
}

// TestInspectOddValues: values JSON cannot hold (NaN, infinities), long
// arrays, nested arrays, bytes and hostile names still give valid output.
func TestInspectOddValues(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := gguf.NewWriter(out)
	w.Set("general.architecture", gguf.String("odd"))
	w.Set("general.file_type", gguf.Uint32(1024|15))
	w.Set("odd.nan", gguf.Float32(float32(math.NaN())))
	w.Set("odd.inf", gguf.Float64(math.Inf(-1)))
	w.Set("odd.eps", gguf.Float32(1e-5))
	w.Set("odd.sections", gguf.MustArray([]int32{16, 24, 24, 0}))
	w.Set("odd.bytes", gguf.MustArray([]uint8{1, 2}))
	w.Set("odd.floats", gguf.MustArray([]float32{float32(math.Inf(1)), 0.1}))
	w.Set("odd.nested", gguf.MustArray([]gguf.Value{gguf.MustArray([]string{"a"})}))
	w.Set("odd.long", gguf.MustArray(make([]int64, 100)))
	w.Set("tokenizer.ggml.tokens", gguf.MustArray([]string{"a", "b"}))
	w.Set("tokenizer.ggml.eos_token_id", gguf.Uint32(7))
	w.Set("tokenizer.ggml.bos_token_id", gguf.String("not a number"))
	w.Set("weird\tkey\n", gguf.String(strings.Repeat("long ", 40)))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.AddTensor("tab\tname", gguf.TypeF32, []uint64{2}))
	must(w.WriteHeader())
	must(w.WriteTensor("tab\tname", make([]byte, 8)))
	must(w.Close())
	must(out.Close())

	js, err := runInspect(t, path, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var r inspectJSON
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, js)
	}
	want := map[string]any{
		"nan": "NaN", "inf": "-Inf", "eps": 1e-5,
		"sections": []any{16.0, 24.0, 24.0, 0.0}, "bytes": []any{1.0, 2.0},
		"floats": []any{"+Inf", 0.1}, "nested": []any{[]any{"a"}},
		"long": map[string]any{"length": 100.0},
	}
	for k, v := range want {
		if !reflect.DeepEqual(r.Hyperparameters[k], v) {
			t.Errorf("hyperparameter %s = %#v, want %#v", k, r.Hyperparameters[k], v)
		}
	}
	if r.FileType == nil || r.FileType.Name != "Q4_K_M (guessed)" {
		t.Errorf("file type %+v", r.FileType)
	}
	if eos := r.Tokenizer.SpecialTokens["eos"]; eos.ID != 7 || eos.Valid {
		t.Errorf("out-of-range eos: %+v", eos)
	}
	if _, ok := r.Tokenizer.SpecialTokens["bos"]; ok {
		t.Error("a string bos id was taken as a token")
	}
	text, err := runInspect(t, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"tab\tname"`, `"weird\tkey\n"`, "7 (not in the vocabulary)", "odd.nan", "NaN", "[int64 × 100]", "… (200 bytes)", "tokenizer.ggml.bos_token_id"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
}

func TestInspectHelpers(t *testing.T) {
	for n, want := range map[uint64]string{0: "0", 999: "999", 1500: "1.5K", 751_600_000: "751.6M", 14_800_000_000: "14.8B", 1_200_000_000_000: "1.2T"} {
		if got := inspParams(n); got != want {
			t.Errorf("inspParams(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 9 << 30: "9.0 GiB"} {
		if got := inspBytes(n); got != want {
			t.Errorf("inspBytes(%d) = %q, want %q", n, got, want)
		}
	}
	for id, want := range map[uint64]string{0: "ALL_F32", 1: "MOSTLY_F16", 7: "Q8_0", 15: "Q4_K_M", 32: "BF16", 38: "MXFP4_MOE", 5: "unknown (5)", 1024 | 18: "Q6_K (guessed)"} {
		if got := llamaFileTypeName(id); got != want {
			t.Errorf("llamaFileTypeName(%d) = %q, want %q", id, got, want)
		}
	}
}
