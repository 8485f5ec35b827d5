//go:build unix

package ops

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Issue 33: a mapped file truncated while the pool reads it faults
// (SIGBUS). The fault becomes a panic on Run's caller, which can recover
// and report it, instead of killing the process.
func TestPoolFaultOnTruncatedMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weights")
	const size = 1 << 20
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // the caller's own chunks
	p := NewPool(4)
	defer p.Close()
	var fault any
	func() {
		defer func() { fault = recover() }()
		// Each chunk sums into its own variable: the chunks run at once,
		// and a shared sum was a data race the race detector reported.
		var sum atomic.Uint32
		p.Run(size/4096, 1, func(lo, hi int) {
			var s byte
			for i := lo; i < hi; i++ {
				s += b[i*4096]
			}
			sum.Add(uint32(s))
		})
		t.Log(sum.Load())
	}()
	if fault == nil {
		t.Fatal("reading past the end of a truncated mapping did not fault")
	}
	if _, ok := fault.(interface{ Addr() uintptr }); !ok {
		t.Errorf("panic %v (%T), want a runtime fault with its address", fault, fault)
	}
}
