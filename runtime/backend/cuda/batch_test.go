package cuda

import (
	"testing"

	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/google/go-cmp/cmp"
)

// TestStepPlan: a step's leading single tokens are its decode rows, short
// while every one of them is below kernels.DecodeShortRow (a decode graph
// is kept apart by it), and the rest are chunks, read from the cache itself
// when their blocks lie in order.
func TestStepPlan(t *testing.T) {
	const block = 256
	short := kernels.DecodeShortRow
	for _, c := range []struct {
		name    string
		pos     []int32
		seq     []int32
		tables  [][]int32
		inOrder bool
		want    stepPlan
	}{
		{"one short row", []int32{21}, []int32{0}, [][]int32{{3}}, true, stepPlan{decode: 1, short: true}},
		{"the last short position", []int32{int32(short - 1)}, []int32{0}, [][]int32{{3, 4}}, true, stepPlan{decode: 1, short: true}},
		{"the first long one", []int32{int32(short)}, []int32{0}, [][]int32{{3, 4}}, true, stepPlan{decode: 1}},
		{"a long row among short ones", []int32{5, 3000, 7}, []int32{0, 1, 2}, [][]int32{{0}, {1, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {4}}, true,
			stepPlan{decode: 3}},
		{"a chunk after a decode row, blocks in order", []int32{9, 0, 1, 2}, []int32{0, 1, 1, 1}, [][]int32{{0}, {5}}, true,
			stepPlan{decode: 1, short: true, chunks: []chunk{{lo: 1, hi: 4, first: 5 * block}}}},
		{"a chunk of blocks out of order", []int32{300, 301}, []int32{0, 0}, [][]int32{{7, 2}}, true,
			stepPlan{chunks: []chunk{{lo: 0, hi: 2, first: -1}}}},
		{"a q8_0 cache's chunk", []int32{0, 1}, []int32{0, 0}, [][]int32{{7}}, false,
			stepPlan{chunks: []chunk{{lo: 0, hi: 2, first: -1}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &ir.Batch{Tokens: make([]int32, len(c.pos)), Pos: c.pos, Seq: c.seq, Tables: c.tables, Block: block}
			var p stepPlan
			p.set(b, 8, c.inOrder)
			if diff := cmp.Diff(c.want, p, cmp.AllowUnexported(stepPlan{}, chunk{})); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}
