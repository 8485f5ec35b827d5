package opstats

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Report lists each batch size's steps by time, parts apart from the sum.
func TestReport(t *testing.T) {
	var tab Table
	for range 2 {
		tab.Add(4, "matmul", 3*time.Millisecond)
		tab.Add(4, "norm", time.Millisecond)
		tab.Add(4, "moe > router", 2*time.Millisecond)
		tab.Batch(4, 10*time.Millisecond)
	}
	tab.Add(1, "matmul", time.Millisecond)
	tab.Batch(1, time.Millisecond)
	var out strings.Builder
	tab.Report(&out, Format{
		Header: func(n int, r *Runs, sum float64) string {
			return "batches of " + strings.Repeat("x", n) + ": " + time.Duration(sum*1e6).String() + " " + (r.Wall / time.Duration(r.Batches)).String()
		},
		Per: "per batch", Width: 12,
		Part: func(name string) bool { return strings.Contains(name, " > ") },
	})
	want := `batches of x: 1ms 1ms
  matmul           1 per batch     1.000 ms per batch   1000.00 µs per call 100.0%
batches of xxxx: 4ms 10ms
  matmul           1 per batch     3.000 ms per batch   3000.00 µs per call  75.0%
  moe > router     1 per batch     2.000 ms per batch   2000.00 µs per call  50.0%
  norm             1 per batch     1.000 ms per batch   1000.00 µs per call  25.0%
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
}
