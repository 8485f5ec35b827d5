package gguf

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/testenv"
)

// seedPrefix is how much of each shared model seeds the fuzzer. The oracle
// headers are about 14 KiB; past that the vocabulary files hold only more
// token strings. Big inputs slow every execution and make the fuzzer spend
// minutes minimising each new finding, so the seeds stay small.
const seedPrefix = 16 << 10

// shrink rebuilds a real model as a small file of the same structure: the
// same keys with arrays cut to 8 elements, the same tensor names and types
// with one block per tensor. Unlike a truncated header it parses, so the
// fuzzer starts from valid real-world layouts.
func shrink(t testing.TB, f *File) []byte {
	return build(t, 3, func(w *Writer) {
		for _, kv := range f.KVs {
			v := kv.Value
			if v.Type == ValArray && v.Len() > 8 {
				v = cut(v, 8)
			}
			w.Set(kv.Key, v)
		}
		for _, ti := range f.Tensors {
			info, _ := ti.Type.Info()
			dims := make([]uint64, len(ti.Dims))
			for i := range dims {
				dims[i] = 1
			}
			dims[0] = uint64(info.BlockSize)
			if err := w.AddTensor(ti.Name, ti.Type, dims); err != nil {
				t.Fatal(err)
			}
		}
	}, nil)
}

// cut keeps the first n elements of an array value.
func cut(v Value, n int) Value {
	rv := reflect.ValueOf(v.Data())
	return Value{Type: ValArray, Elem: v.Elem, v: rv.Slice(0, n).Interface()}
}

// fuzzSeeds are small valid files covering every value type, nested
// arrays, v1 to v3, several alignments and tensor layouts.
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, v := range []uint32{2, 3} {
		seeds = append(seeds, build(t, v, fillAllValues, nil))
		seeds = append(seeds, build(t, v, fillTensors(8), nil))
	}
	seeds = append(seeds, build(t, 3, fillTensors(64), nil))
	seeds = append(seeds, build(t, 3, func(w *Writer) {}, nil))
	seeds = append(seeds, v1File())
	return seeds
}

// FuzzParse feeds arbitrary bytes to Parse. Run it with
//
//	go test -run=NONE -fuzz=FuzzParse -fuzztime=10m -fuzzminimizetime=200x -parallel=1 ./gguf
//
// The -fuzzminimizetime cap matters: by default the fuzzer spends up to a
// minute minimising every new finding, and on this parser that stalled it
// for most of its time (about 15k execs/s with the cap, long runs of 0
// without). Crashers land in testdata/fuzz/FuzzParse; keep them there as
// regression seeds.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	if d := testenv.SharedDirOrEmpty(); d != "" {
		for _, sub := range []string{"oracle", "vocab"} {
			m, _ := filepath.Glob(filepath.Join(d, "testdata", sub, "*.gguf"))
			for _, p := range m {
				if sf, err := Open(p); err == nil {
					f.Add(shrink(f, sf))
					sf.Close()
				}
				fd, err := os.Open(p)
				if err != nil {
					f.Fatal(err)
				}
				b, err := io.ReadAll(io.LimitReader(fd, seedPrefix))
				fd.Close()
				if err != nil {
					f.Fatal(err)
				}
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		before := heapAllocated(false)
		start := time.Now()
		pf, err := Parse("fuzz.gguf", b)
		took := time.Since(start)
		used := heapAllocated(false) - before
		limit := 64*uint64(len(b)) + 1<<20
		if used > limit {
			// The counter lags: small allocations are counted when a
			// per-P cache gives back its span, which can land inside this
			// window (up to a few MiB of earlier allocations). Measure
			// again exactly, flushing the caches before and after.
			before = heapAllocated(true)
			Parse("fuzz.gguf", b)
			used = heapAllocated(true) - before
		}

		// Parsing is linear in the input; seconds mean a quadratic path or
		// a loop that does not advance.
		if took > 5*time.Second {
			t.Fatalf("parse of %d bytes took %v", len(b), took)
		}
		// Every count is checked against the bytes left before anything is
		// allocated, so memory stays proportional to the input.
		if used > limit {
			t.Fatalf("parse of %d bytes allocated %d bytes (limit %d)", len(b), used, limit)
		}
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error is %T, not *ParseError: %v", err, err)
			}
			if pe.Offset < 0 || pe.Offset > int64(len(b)) {
				t.Fatalf("error offset %d outside the %d-byte input: %v", pe.Offset, len(b), err)
			}
			return
		}
		// Accessors that callers use on every tensor must not panic either
		// (Rows once divided by a zero row length).
		for _, tn := range pf.Tensors {
			if tn.Rows()*tn.Dims[0] != tn.Elements() {
				t.Fatalf("tensor %q: %d rows of %d != %d elements", tn.Name, tn.Rows(), tn.Dims[0], tn.Elements())
			}
		}
		// Anything that parses must re-encode to a file that parses to the
		// same model, and re-encoding that must be stable.
		var out bytes.Buffer
		if _, err := pf.WriteTo(&out); err != nil {
			t.Fatalf("WriteTo of a parsed file: %v", err)
		}
		b2 := append([]byte(nil), out.Bytes()...)
		pf2, err := Parse("fuzz2.gguf", b2)
		if err != nil {
			t.Fatalf("re-encoded file does not parse: %v", err)
		}
		if err := headerDiff(pf, pf2, pf.Version() != 1); err != nil {
			t.Fatalf("re-encoded file differs: %v", err)
		}
		out.Reset()
		if _, err := pf2.WriteTo(&out); err != nil {
			t.Fatalf("WriteTo of the re-encoded file: %v", err)
		}
		if !bytes.Equal(out.Bytes(), b2) {
			t.Fatalf("re-encoding is not stable: %d bytes, then %d", len(b2), out.Len())
		}
	})
}

var heapAllocs = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}

// heapAllocated is the running total of bytes allocated on the heap. With
// exact set it first runs a collection, which flushes every per-P
// allocation cache into the total; that costs milliseconds, so the fuzz
// loop does it only to confirm a suspicious reading.
func heapAllocated(exact bool) uint64 {
	if exact {
		runtime.GC()
	}
	metrics.Read(heapAllocs)
	return heapAllocs[0].Value.Uint64()
}
