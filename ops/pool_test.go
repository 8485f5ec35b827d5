package ops

import (
	"sync/atomic"
	"testing"
	"time"
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

// TestPoolExpect: Expect wakes the parked workers, which then spin (not
// park) until its deadline, and Runs before, during and after it compute
// every item once; on a nil or one-thread pool it does nothing.
func TestPoolExpect(t *testing.T) {
	var none *Pool
	none.Expect(time.Millisecond)
	one := NewPool(1)
	one.Expect(time.Millisecond)
	one.Close()

	p := NewPool(4)
	defer p.Close()
	run := func() {
		hits := make([]int32, 1000)
		p.RunChunks(len(hits), 7, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				atomic.AddInt32(&hits[i], 1)
			}
		})
		for i, h := range hits {
			if h != 1 {
				t.Fatalf("item %d run %d times", i, h)
			}
		}
	}
	parked := func() int {
		n := 0
		for _, w := range p.workers {
			if w.state.Load() == workerParked {
				n++
			}
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("waited 5 s for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for rep := range 5 {
		run()
		waitFor("the workers to park", func() bool { return parked() == len(p.workers) })
		expected := time.Now()
		p.Expect(200 * time.Millisecond)
		if n := parked(); n != 0 {
			t.Fatalf("rep %d: %d workers still parked after Expect", rep, n)
		}
		time.Sleep(20 * time.Millisecond) // past spinFor, within the expectation
		// A loaded machine may sleep this goroutine past the expectation,
		// where parking is right: then the check says nothing.
		if n := parked(); n != 0 && time.Since(expected) < 150*time.Millisecond {
			t.Errorf("rep %d: %d workers parked within the expectation", rep, n)
		}
		run()
		// A late helper within the expectation: the Run still waits for
		// every chunk.
		var sum atomic.Int64
		p.RunChunks(2, 1, func(lo, hi int) {
			if lo == 1 {
				time.Sleep(time.Millisecond)
				sum.Add(1)
			}
		})
		if sum.Load() != 1 {
			t.Fatalf("rep %d: Run returned before its late chunk finished", rep)
		}
		if rep == 4 {
			p.Expect(0) // an expectation that has passed: they park as usual
			waitFor("the workers to park after a passed expectation", func() bool { return parked() == len(p.workers) })
		}
	}
}
