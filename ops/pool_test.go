package ops

import (
	"sync/atomic"
	"testing"
)

// TestRunChunksGuided: every item once, chunks of at least size items
// (but the last) and in multiples of size, shrinking as the work runs out.
func TestRunChunksGuided(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 7, 64, 1000, 151936} {
			for _, size := range []int{1, 3, 8, 113} {
				hits := make([]int32, n)
				var calls atomic.Int32
				p.RunChunks(n, size, func(lo, hi int) {
					calls.Add(1)
					if hi < n && ((hi-lo)%size != 0 || hi-lo < size) {
						t.Errorf("threads %d n %d size %d: chunk [%d,%d) is not a multiple of the size", threads, n, size, lo, hi)
					}
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				for i, h := range hits {
					if h != 1 {
						t.Fatalf("threads %d n %d size %d: item %d run %d times", threads, n, size, i, h)
					}
				}
				// Guided chunks: far fewer calls than n/size for big n.
				if threads > 1 && n == 151936 && size == 113 && calls.Load() > 200 {
					t.Errorf("threads %d: %d chunks for %d items of chunk size %d", threads, calls.Load(), n, size)
				}
			}
		}
		p.Close()
	}
}

// TestPoolBlocksOnLateHelper: a Run whose helper is slow (here: sleeping)
// still completes, through the blocking wait, and a later Run works.
func TestPoolBlocksOnLateHelper(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for rep := 0; rep < 20; rep++ {
		var sum atomic.Int64
		p.RunChunks(2, 1, func(lo, hi int) {
			if lo == 1 {
				for i := 0; i < 200000; i++ {
					sum.Add(1)
				}
			}
		})
		if sum.Load() != 200000 {
			t.Fatalf("rep %d: Run returned before its chunks finished (%d)", rep, sum.Load())
		}
	}
}
