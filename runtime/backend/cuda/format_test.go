package cuda

import (
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// TestActivationFormats: a weight's products read activations rounded as
// the CPU's products of that type do (Q8_K's blocks of 256 for the
// k-quants, 32 for the others, in both the matrix-vector and the
// tensor-core forms), and members of a group that disagree share the form
// every one of them reads.
func TestActivationFormats(t *testing.T) {
	for _, c := range []struct {
		typ      gguf.Type
		q8, f16  actFormat
		q8Values int
	}{
		{gguf.TypeQ4_K, actQ8_K, actF16K, 256},
		{gguf.TypeQ6_K, actQ8_K, actF16K, 256},
		{gguf.TypeQ2_K, actQ8_K, actF16K, 256},
		{gguf.TypeQ8_0, actQ8_1, actF16, 32},
		{gguf.TypeQ4_0, actQ8_1, actF16, 32},
		{gguf.TypeQ5_1, actQ8_1, actF16, 32},
	} {
		if got := q8Format(c.typ); got != c.q8 {
			t.Errorf("q8Format(%s) = %d, want %d", c.typ, got, c.q8)
		}
		if got := f16Format(c.typ); got != c.f16 {
			t.Errorf("f16Format(%s) = %d, want %d", c.typ, got, c.f16)
		}
		if got := c.q8.q8Block(); got != c.q8Values {
			t.Errorf("%s: q8Block = %d, want %d", c.typ, got, c.q8Values)
		}
	}
	for _, c := range []struct{ a, b, want actFormat }{
		{actQ8_K, actQ8_K, actQ8_K},
		{actQ8_K, actQ8_1, actQ8_1},
		{actQ8_1, actQ8_K, actQ8_1},
		{actF16K, actF16K, actF16K},
		{actF16K, actF16, actF16},
		{actF16, actF16K, actF16},
		{actF32, actF32, actF32},
		{actQ8_K, actF16K, actMixed},
		{actF32, actQ8_1, actMixed},
		{actF16, actF32, actMixed},
	} {
		if got := commonFormat(c.a, c.b); got != c.want {
			t.Errorf("commonFormat(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	for _, f := range []actFormat{actF32, actF16, actF16K, actMixed} {
		if f.q8Block() != 0 {
			t.Errorf("format %d: q8Block %d, want 0 (not Q8)", f, f.q8Block())
		}
	}
}
