//go:build unix

package cuda

import (
	"testing"
	"time"
)

// processCPUTime counts a busy stretch of this thread (the split's count
// of busy threads divides it by wall time). The loop spins until the
// count moves by 10 ms rather than for a wall time: on a loaded machine
// the thread may get a small share of the wall time, and only a count
// that never moves is wrong.
func TestProcessCPUTime(t *testing.T) {
	c0, start := processCPUTime(), time.Now()
	x := uint64(1)
	for processCPUTime()-c0 < 10*time.Millisecond {
		for range 1 << 16 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("20 s busy counted as %v of CPU time (x %d)", processCPUTime()-c0, x)
		}
	}
}
