package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
)

// longOracle is the layout of testdata/oracle/long/*.logits.json: the
// short oracles' fields, with prefill_logits holding only the rows of
// the prompt's last tokens, from prefill_from on.
type longOracle struct {
	oracleLogits
	PrefillFrom int    `json:"prefill_from"`
	NCtx        int    `json:"n_ctx"`
	KV          string `json:"kv"`
}

// TestLongOracles checks the CPU backend against llama.cpp's logits after
// a 3000-token prompt in a 4096 context, with the KV cache the file names
// (f16, or q8_0 for the -kvq8 files): the prompt's last rows, then each
// decode step with the oracle's tokens fed in (teacher forcing), under
// the short oracles' bounds.
func TestLongOracles(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "long", "*.logits.json"))
	if len(files) == 0 {
		t.Skipf("no long oracles in %s", filepath.Join(dir, "long"))
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".logits.json")
		model := strings.TrimSuffix(strings.TrimSuffix(name, "-kvq8"), "-long")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var want longOracle
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			kt, err := ops.ParseKVType(want.KV)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			m, err := Open(filepath.Join(dir, model+".gguf"))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c, err := m.NewContext(ContextOptions{Threads: 2, CtxSize: want.NCtx, KVType: kt})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Eval(want.Prompt[:want.PrefillFrom], false); err != nil {
				t.Fatal(err)
			}
			last, err := c.Eval(want.Prompt[want.PrefillFrom:], true)
			if err != nil {
				t.Fatal(err)
			}
			var got, ref []float32
			got = append(got, last...)
			for _, r := range want.PrefillLogits {
				ref = append(ref, r...)
			}
			prefill := nmse(got, ref)
			for s, tok := range want.Generated {
				l, err := c.Eval([]int{tok}, false)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, l...)
				ref = append(ref, want.DecodeLogits[s]...)
			}
			if len(got) != len(ref) {
				t.Fatalf("%d logits, oracle has %d", len(got), len(ref))
			}
			e, tol := nmse(got, ref), oracleTolerance(model)
			t.Logf("%s (%s cache): NMSE %.3g (prompt rows %.3g; bound %.0e)", name, kt, e, prefill, tol)
			if e > tol {
				t.Errorf("NMSE %.3g over the bound %.0e", e, tol)
			}
		})
	}
}
