//go:build unix

package cuda

import (
	"testing"
	"time"
)

// processCPUTime counts a busy stretch of this thread (the split's count
// of busy threads divides it by wall time).
func TestProcessCPUTime(t *testing.T) {
	c0, start := processCPUTime(), time.Now()
	x := uint64(1)
	for time.Since(start) < 30*time.Millisecond {
		x = x*6364136223846793005 + 1442695040888963407
	}
	if d := processCPUTime() - c0; d < 10*time.Millisecond {
		t.Errorf("30 ms busy counted as %v of CPU time (x %d)", d, x)
	}
}
