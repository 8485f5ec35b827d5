package runtime

import (
	"testing"

	"github.com/atsinfer/ats/runtime/ir"
)

// repackHybrid repacks only host units' matrices, never the embedding or a
// GPU-resident matrix, within what the resident matrices give back plus
// a thirty-second of the weights, dense products first.
func TestRepackHybrid(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, BackendCPU)
	var total, released int64
	for i, u := range units {
		for _, w := range u.Mats {
			total += w.Bytes()
		}
		if u.Layer%2 == 1 { // odd layers resident
			pl.Units[i].Backend = BackendGPU
			for _, w := range u.Mats {
				released += w.Bytes()
			}
		}
	}
	got := m.repackHybrid(pl)
	if !m.File.Mapped {
		released = 0
	}
	if limit := released + total/32; got > limit {
		t.Fatalf("repacked %d bytes, over the allowance %d", got, limit)
	}
	if got == 0 {
		if _, ok := units[1].Mats[0].Mat.Repack(); !ok {
			t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
		}
		t.Fatal("nothing repacked")
	}
	for i, u := range units {
		for _, w := range u.Mats {
			packed := w.Mat.RepackedBytes() > 0
			switch {
			case packed && pl.resident(i):
				t.Errorf("%s is GPU-resident but was repacked", w.Name)
			case packed && u.Op == ir.OpEmbed:
				t.Errorf("the embedding %s was repacked", w.Name)
			}
		}
	}
	if again := m.repackHybrid(pl); again != got {
		t.Errorf("a second call repacked more: %d after %d", again, got)
	}
}
