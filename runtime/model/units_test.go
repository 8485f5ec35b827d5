package model_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

func openOracle(t *testing.T, name string) *model.Model {
	t.Helper()
	path := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", name+".gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err) // the repository's testdata/ holds every oracle
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func oracleFiles(t *testing.T) []string {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no oracle models in %s", dir)
	}
	return files
}

// programUnits is model.Units with an f16 cache of ctx rows.
func programUnits(p *ir.Program, ctx int, deviceBytes func(*ir.Weight) int64) []model.Unit {
	return model.Units(p, model.KV{Rows: ctx, Type: kvcache.F16}, deviceBytes)
}

// TestUnitsPartitionOps checks the units of every oracle: each op in
// exactly one unit, units in order, every matrix in a unit, attention
// units sized by the KV cache.
func TestUnitsPartitionOps(t *testing.T) {
	for _, path := range oracleFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			const ctx = 100
			units := programUnits(m.Prog, ctx, nil)
			next := 0
			mats := map[*ir.Weight]int{}
			for i, u := range units {
				if u.Index != i || u.Lo != next || u.Hi <= u.Lo {
					t.Fatalf("unit %d (%s) covers ops [%d,%d), want to start at %d", i, u.Name, u.Lo, u.Hi, next)
				}
				next = u.Hi
				for _, w := range u.Mats {
					mats[w]++
				}
				if u.Anchor == ir.AnchorCache {
					a := m.Prog.Ops[u.Hi-1].Attn
					if want := int64(4 * ctx * a.NKVHeads * a.HeadSize); u.Bytes != want {
						t.Errorf("%s: %d bytes, want the KV cache's %d", u.Name, u.Bytes, want)
					}
				}
			}
			if next != len(m.Prog.Ops) {
				t.Fatalf("units end at op %d of %d", next, len(m.Prog.Ops))
			}
			for i := range m.Prog.Ops {
				for _, w := range m.Prog.Ops[i].Weights() {
					if len(w.Dims) > 1 && mats[w] == 0 {
						t.Errorf("matrix %s is in no unit", w.Name)
					}
				}
			}
			// Roles of layer 1.
			var roles []string
			for _, u := range units {
				if u.Layer == 1 {
					roles = append(roles, u.Role)
				}
			}
			t.Logf("%d ops, %d units; layer 1: %s", len(m.Prog.Ops), len(units), strings.Join(roles, " "))
		})
	}
}

func TestUnitsRoles(t *testing.T) {
	for name, want := range map[string]string{
		"tiny-qwen3-q4_k_m":    "attn_q attn_k attn_v attention attn_output ffn_gate ffn_up ffn_down",
		"tiny-qwen3moe-q4_k_m": "attn_q attn_k attn_v attention attn_output ffn_moe",
		"tiny-glm4-q4_k_m":     "attn_q attn_k attn_v attention attn_output ffn_up ffn_down",
	} {
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			var roles []string
			for _, u := range programUnits(m.Prog, 64, nil) {
				if u.Layer == 1 {
					roles = append(roles, u.Role)
				}
				if u.Role == "ffn_moe" && len(u.Mats) != 4 {
					t.Errorf("%s: %d matrices, want the router and three stacks", u.Name, len(u.Mats))
				}
			}
			if got := strings.Join(roles, " "); got != want {
				t.Errorf("layer 1 roles %q, want %q", got, want)
			}
		})
	}
}

// TestDecodeBytes: a dense unit's decode reads all of it, an MoE layer's
// only the router and top-k of its experts.
func TestDecodeBytes(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	for _, u := range programUnits(m.Prog, 64, nil) {
		switch {
		case u.Experts > 0:
			h := m.Prog.Hyper
			if u.DecodeBytes <= 0 || u.DecodeBytes*int64(h.NExpert) > u.Bytes*int64(h.NExpertUsed)+u.Bytes {
				t.Errorf("%s: decode reads %d of %d bytes; want about %d/%d of the stacks", u.Name, u.DecodeBytes, u.Bytes, h.NExpertUsed, h.NExpert)
			}
		case u.DecodeBytes != u.Bytes:
			t.Errorf("%s: decode reads %d of %d bytes", u.Name, u.DecodeBytes, u.Bytes)
		}
	}
}
