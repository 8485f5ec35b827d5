package hub

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Ref
	}{
		{"hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M", Ref{Repo: "Qwen/Qwen3-8B-GGUF", Quant: "Q4_K_M"}},
		{"hf.co/Qwen/Qwen3-8B-GGUF", Ref{Repo: "Qwen/Qwen3-8B-GGUF"}},
		{"huggingface.co/unsloth/GLM-4-9B-0414-GGUF:q8_0", Ref{Repo: "unsloth/GLM-4-9B-0414-GGUF", Quant: "q8_0"}},
		{"https://huggingface.co/Qwen/Qwen3-8B-GGUF", Ref{Repo: "Qwen/Qwen3-8B-GGUF"}},
		{"https://huggingface.co/Qwen/Qwen3-8B-GGUF/", Ref{Repo: "Qwen/Qwen3-8B-GGUF"}},
		{"https://example.com/m/model.gguf", Ref{URL: "https://example.com/m/model.gguf"}},
		{"https://huggingface.co/Qwen/Qwen3-8B-GGUF/blob/main/Qwen3-8B-Q4_K_M.gguf",
			Ref{URL: "https://huggingface.co/Qwen/Qwen3-8B-GGUF/resolve/main/Qwen3-8B-Q4_K_M.gguf"}},
	} {
		got, err := ParseRef(tc.in)
		if err != nil {
			t.Errorf("ParseRef(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseRef(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"qwen3:8b", "want hf.co/ORG/REPO"},
		{"hf.co/Qwen", "ORG/REPO"},
		{"hf.co/a/b/c", "ORG/REPO"},
		{"hf.co/../x:Q4", "ORG/REPO"},
		{"hf.co/a/b:Q4 K", "quantization"},
		{"https://example.com/page.html", ".gguf"},
	} {
		_, err := ParseRef(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRef(%q) = %v, want an error mentioning %q", tc.in, err, tc.want)
		}
	}
}

func TestQuantOf(t *testing.T) {
	for in, want := range map[string]string{
		"Qwen3-8B-Q4_K_M.gguf":                         "Q4_K_M",
		"qwen3-8b-q4_k_m.gguf":                         "Q4_K_M",
		"Qwen3-8B-IQ4_XS.gguf":                         "IQ4_XS",
		"Qwen3-8B-Q8_0.gguf":                           "Q8_0",
		"Llama-3.2-1B-Instruct-f16.gguf":               "F16",
		"Qwen3-0.6B-BF16.gguf":                         "BF16",
		"Qwen3-30B-A3B-UD-Q4_K_XL.gguf":                "Q4_K_XL",
		"Q6_K/Qwen3-235B-Q6_K-00001-of-00003.gguf":     "Q6_K",
		"BF16/Qwen3-235B-A22B-00001-of-00002.gguf":     "BF16",
		"gpt-oss-20b-MXFP4.gguf":                       "MXFP4",
		"model.gguf":                                   "",
		"Qwen2.5-Coder-7B-Instruct-Q5_K_S.gguf":        "Q5_K_S",
		"Meta-Llama-3.1-8B-Instruct-Q4_0_4_4.gguf":     "Q4_0_4_4",
		"DeepSeek-R1-Distill-Qwen-1.5B-Q4_K_M.gguf":    "Q4_K_M",
		"gguf/some-model-without-a-quant-in-name.gguf": "",
		"Q4_K_M/some-model-without-a-quant-in-it.gguf": "Q4_K_M",
	} {
		if got := quantOf(in); got != want {
			t.Errorf("quantOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPickGGUF(t *testing.T) {
	repo := []string{
		"README.md", ".gitattributes",
		"Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q8_0.gguf", "Qwen3-8B-IQ4_XS.gguf", "Qwen3-8B-Q4_K.gguf",
		"mmproj-Qwen3-8B-F16.gguf",
		"Q6_K/Qwen3-8B-Q6_K-00002-of-00002.gguf", "Q6_K/Qwen3-8B-Q6_K-00001-of-00002.gguf",
		"BF16/Qwen3-8B-BF16-00001-of-00003.gguf", "BF16/Qwen3-8B-BF16-00002-of-00003.gguf", // part 3 missing
	}
	for _, tc := range []struct {
		quant     string
		files     []string
		wantQuant string
	}{
		{"Q4_K_M", []string{"Qwen3-8B-Q4_K_M.gguf"}, "Q4_K_M"},
		{"q4_k_m", []string{"Qwen3-8B-Q4_K_M.gguf"}, "Q4_K_M"},
		{"", []string{"Qwen3-8B-Q4_K_M.gguf"}, "Q4_K_M"}, // the default
		{"Q4_K", []string{"Qwen3-8B-Q4_K.gguf"}, "Q4_K"},
		{"iq4_xs", []string{"Qwen3-8B-IQ4_XS.gguf"}, "IQ4_XS"},
		{"Q6_K", []string{"Q6_K/Qwen3-8B-Q6_K-00001-of-00002.gguf", "Q6_K/Qwen3-8B-Q6_K-00002-of-00002.gguf"}, "Q6_K"},
	} {
		files, q, err := pickGGUF("Qwen/Qwen3-8B-GGUF", repo, tc.quant)
		if err != nil {
			t.Errorf("quant %q: %v", tc.quant, err)
			continue
		}
		if diff := cmp.Diff(tc.files, files); diff != "" || q != tc.wantQuant {
			t.Errorf("quant %q: got %v %q, want %v %q", tc.quant, files, q, tc.files, tc.wantQuant)
		}
	}
	// A quant that is not there: the error lists those that are (not the
	// incomplete BF16 split, nor the projector).
	_, _, err := pickGGUF("Qwen/Qwen3-8B-GGUF", repo, "Q3_K_S")
	if err == nil || !strings.Contains(err.Error(), "no Q3_K_S file") || !strings.Contains(err.Error(), "IQ4_XS, Q4_K, Q4_K_M, Q6_K, Q8_0") {
		t.Errorf("missing quant: %v", err)
	}
	// One model in the repository: no quant needed.
	files, q, err := pickGGUF("a/b", []string{"README.md", "b-Q8_0.gguf"}, "")
	if err != nil || len(files) != 1 || q != "Q8_0" {
		t.Errorf("single model: %v %q %v", files, q, err)
	}
	// Several models and no Q4_K_M: say so.
	_, _, err = pickGGUF("a/b", []string{"b-Q8_0.gguf", "b-F16.gguf"}, "")
	if err == nil || !strings.Contains(err.Error(), "Q4_K_M is not there") || !strings.Contains(err.Error(), "F16, Q8_0") {
		t.Errorf("no default: %v", err)
	}
	if _, _, err := pickGGUF("a/b", []string{"README.md"}, ""); err == nil || !strings.Contains(err.Error(), "no .gguf file") {
		t.Errorf("no gguf: %v", err)
	}
	if _, _, err := pickGGUF("a/b", []string{"m-00001-of-00002.gguf"}, ""); err == nil || !strings.Contains(err.Error(), "misses parts") {
		t.Errorf("incomplete split: %v", err)
	}
}

func TestShortAlias(t *testing.T) {
	for _, tc := range [][3]string{
		{"Qwen/Qwen3-8B-GGUF", "Q4_K_M", "qwen3-8b:q4_k_m"},
		{"unsloth/GLM-4-9B-0414-GGUF", "Q8_0", "glm-4-9b-0414:q8_0"},
		{"org/model", "", "model"},
	} {
		if got := shortAlias(tc[0], tc[1]); got != tc[2] {
			t.Errorf("shortAlias(%q, %q) = %q, want %q", tc[0], tc[1], got, tc[2])
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"qwen3:8b", "hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M", "my-model", "a/b/c"} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ":x", "a:", "a:b:c", "../x", "a//b", "a b", "/abs", "a/./b", "x:..", "a\\b"} {
		if err := ValidateName(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}
