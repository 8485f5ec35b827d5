package cudadrv

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
)

// The test process shares one retained primary context: releasing it after
// each test would destroy it and make the next test pay its creation again.
var testGPU struct {
	once sync.Once
	ctx  *Context
	info DeviceInfo
	err  error
}

// needGPU returns the shared context of device 0, or skips the test with
// the reason CUDA is unavailable. A driver that is present but fails is a
// test failure, not a skip.
func needGPU(tb testing.TB) (*Context, DeviceInfo) {
	tb.Helper()
	if ok, reason := Available(); !ok {
		tb.Skip("skipping GPU test: " + reason)
	}
	testGPU.once.Do(func() {
		d, err := GetDevice(0)
		if err != nil {
			testGPU.err = err
			return
		}
		if testGPU.info, err = d.Info(); err != nil {
			testGPU.err = err
			return
		}
		testGPU.ctx, testGPU.err = d.RetainPrimaryContext()
	})
	if testGPU.err != nil {
		tb.Fatalf("device 0: %v", testGPU.err)
	}
	return testGPU.ctx, testGPU.info
}

// randBytes returns n random bytes from a fixed-seed generator.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// firstDiff returns the index of the first differing byte, or -1.
func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// isResult reports whether err wraps the CUDA result r.
func isResult(err error, r Result) bool { return errors.Is(err, r) }
