package ops

import (
	"strings"
	"testing"
)

// A panic in a chunk, on a worker or on the caller, reaches Run's caller,
// and the pool goes on working.
func TestPoolPanicReachesCaller(t *testing.T) {
	p := NewPool(4)
	defer p.Close()
	for _, bad := range []int{0, 999} { // the caller's first chunk, a worker's last
		func() {
			defer func() {
				r := recover()
				if s, ok := r.(string); !ok || !strings.Contains(s, "item") {
					t.Errorf("Run panicked with %v, want the chunk's panic", r)
				}
			}()
			p.Run(1000, 1, func(lo, hi int) {
				if lo <= bad && bad < hi {
					panic("item")
				}
			})
			t.Errorf("Run returned after a panic in item %d", bad)
		}()
	}
	var n [1000]int
	p.Run(1000, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			n[i]++
		}
	})
	for i, c := range n {
		if c != 1 {
			t.Fatalf("item %d done %d times after the panics", i, c)
		}
	}
}
