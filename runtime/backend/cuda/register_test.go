package cuda

import (
	"os"
	"testing"
	"unsafe"

	"github.com/atsinfer/ats/runtime/ir"
)

// streamedParts registers whole pages around every matrix that may stream
// and is not resident, merges neighbours, and leaves out the pages that
// hold only resident matrices or vectors.
func TestStreamedParts(t *testing.T) {
	page := os.Getpagesize()
	file := make([]byte, 40*page+100)
	type span struct{ off, n int }
	// Offsets not page-aligned, as in a GGUF file (32-byte alignment).
	layout := []struct {
		span
		vector, streams, resident bool
	}{
		{span{96, 3*page + 32}, false, true, false},         // 0: streams
		{span{3*page + 128, 2 * page}, false, true, false},  // 1: streams, shares a page with 0
		{span{6*page + 64, 8 * page}, false, false, true},   // 2: resident
		{span{15*page + 32, 64}, true, true, false},         // 3: a vector
		{span{16*page + 32, 5 * page}, false, true, true},   // 4: resident, though it could stream
		{span{22*page + 32, 4 * page}, false, true, false},  // 5: streams, alone
		{span{30*page + 32, 2 * page}, false, false, false}, // 6: CPU only, never streams
	}
	p := &ir.Program{}
	ws := make([]*ir.Weight, len(layout))
	for i, l := range layout {
		w := &ir.Weight{Name: string(rune('a' + i)), Data: file[l.off : l.off+l.n], Dims: []int{l.n, 1}}
		if l.vector {
			w.Dims = []int{l.n}
		}
		ws[i] = w
		p.Ops = append(p.Ops, ir.Op{Kind: ir.OpMatMul, W: w})
	}
	streams, resident := map[*ir.Weight]bool{}, map[*ir.Weight]bool{}
	for i, w := range ws {
		streams[w], resident[w] = layout[i].streams, layout[i].resident
	}
	parts := streamedParts([][]byte{file}, p, streams, resident)

	base := uintptr(unsafe.Pointer(&file[0]))
	offOf := func(b []byte) int { return int(uintptr(unsafe.Pointer(&b[0])) - base) }
	covered := func(off, n int) bool {
		for _, pt := range parts {
			if o := offOf(pt); off >= o && off+n <= o+len(pt) {
				return true
			}
		}
		return false
	}
	for i, l := range layout {
		want := l.streams && !l.resident && !l.vector
		if got := covered(l.off, l.n); got != want {
			t.Errorf("weight %d: registered %v, want %v", i, got, want)
		}
	}
	if len(parts) != 2 {
		t.Errorf("%d stretches, want 2 (weights 0 and 1 merged, 5 alone)", len(parts))
	}
	prevEnd := -1
	for _, pt := range parts {
		o := offOf(pt)
		if (uintptr(o)+base)%uintptr(page) != 0 && o != 0 {
			t.Errorf("stretch at %d does not start on a page", o)
		}
		if o <= prevEnd {
			t.Errorf("stretch at %d overlaps the one before (ending %d)", o, prevEnd)
		}
		prevEnd = o + len(pt)
	}
	if got := streamedParts([][]byte{file}, p, nil, resident); got != nil {
		t.Errorf("nothing streams, yet %d stretches", len(got))
	}
}
