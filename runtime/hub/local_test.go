package hub

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseRefWithoutHost(t *testing.T) {
	for in, want := range map[string]Ref{
		"Qwen/Qwen3-0.6B-GGUF":       {Repo: "Qwen/Qwen3-0.6B-GGUF"},
		"Qwen/Qwen3-0.6B-GGUF:Q8_0":  {Repo: "Qwen/Qwen3-0.6B-GGUF", Quant: "Q8_0"},
		"hf.co/Qwen/Qwen3-0.6B-GGUF": {Repo: "Qwen/Qwen3-0.6B-GGUF"},
	} {
		got, err := ParseRef(in)
		if err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"models/x.gguf", "a/b/c", "qwen3:8b"} {
		if r, err := ParseRef(bad); err == nil {
			t.Errorf("%s: parsed as %+v", bad, r)
		}
	}
}

func TestImportLocalFile(t *testing.T) {
	st := &Store{Dir: t.TempDir()}
	src := filepath.Join(t.TempDir(), "My-Model-Q8_0.gguf")
	if err := os.WriteFile(src, []byte("GGUF test"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := st.Import(src, ImportOptions{Quant: "Q8_0", Aliases: []string{"mine"}})
	if err != nil {
		t.Fatal(err)
	}
	found, err := st.Find("mine")
	if err != nil || found.Name != "my-model-q8_0" || found.Quant != "Q8_0" || found.Size() != 9 {
		t.Fatalf("find: %+v %v", found, err)
	}
	if b, err := os.ReadFile(found.Path()); err != nil || string(b) != "GGUF test" {
		t.Errorf("the registered file reads %q, %v", b, err)
	}
	if _, err := st.Import(src, ImportOptions{}); err == nil {
		t.Error("a second import under the same name was accepted")
	}
	if _, err := st.Remove(m.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		t.Errorf("rm removed the original file: %v", err)
	}
}
