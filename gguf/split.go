package gguf

import (
	"fmt"
	"os"
	"strings"
)

// The metadata keys llama.cpp's gguf-split writes into every part of a split
// model. split.no is 0-based; only the first part carries the model's other
// metadata.
const (
	KeySplitNo           = "split.no"            // uint16
	KeySplitCount        = "split.count"         // uint16
	KeySplitTensorsCount = "split.tensors.count" // int32, tensors in all parts
)

// SplitPath is the file name of part i (1-based) of a model split into n
// parts: prefix-0000i-of-0000n.gguf, as llama.cpp names them.
func SplitPath(prefix string, i, n int) string {
	return fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, i, n)
}

// TensorData is a tensor to write: its shape, type and bytes.
type TensorData struct {
	Name string
	Type Type
	Dims []uint64
	Data []byte
}

// WriteSplit writes a model as len(parts) GGUF v3 files named
// SplitPath(prefix, i, len(parts)); parts[i] lists the tensors of part i+1
// in order. Every part gets the split keys; the first part also gets kvs
// (any split.* keys in kvs are replaced). It returns the paths written.
// A part may hold no tensors, as llama.cpp's --split-max-size can produce.
func WriteSplit(prefix string, kvs []KV, parts [][]TensorData) ([]string, error) {
	n := len(parts)
	if n == 0 || n > 65535 {
		return nil, fmt.Errorf("gguf: split into %d parts: want 1 to 65535 (split.count is a uint16)", n)
	}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if total > 1<<31-1 {
		return nil, fmt.Errorf("gguf: split of %d tensors: split.tensors.count is an int32", total)
	}
	var paths []string
	for i, tensors := range parts {
		path := SplitPath(prefix, i+1, n)
		if err := writePart(path, i, n, total, kvs, tensors); err != nil {
			for _, p := range append(paths, path) {
				os.Remove(p)
			}
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func writePart(path string, i, n, total int, kvs []KV, tensors []TensorData) (err error) {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("gguf: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("gguf: %w", cerr)
		}
	}()
	w := NewWriter(out)
	w.Set(KeySplitNo, Uint16(uint16(i)))
	w.Set(KeySplitCount, Uint16(uint16(n)))
	w.Set(KeySplitTensorsCount, Int32(int32(total)))
	for _, kv := range kvs {
		if strings.HasPrefix(kv.Key, "split.") {
			continue
		}
		// Later parts keep the alignment so their data is laid out the same
		// way; everything else lives only in the first part.
		if i == 0 || kv.Key == "general.alignment" {
			w.Set(kv.Key, kv.Value)
		}
	}
	for _, t := range tensors {
		if err := w.AddTensor(t.Name, t.Type, t.Dims); err != nil {
			return fmt.Errorf("%w (writing %s)", err, path)
		}
	}
	if err := w.WriteHeader(); err != nil {
		return fmt.Errorf("%w (writing %s)", err, path)
	}
	// AddTensor lays tensors out in the order added, so Next follows it.
	for _, t := range tensors {
		if err := w.WriteTensor(t.Name, t.Data); err != nil {
			return fmt.Errorf("%w (writing %s)", err, path)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("%w (writing %s)", err, path)
	}
	return nil
}

// SplitEvenly groups tensors, keeping their order, into n parts of roughly
// equal data size. Every part gets at least one tensor when there are at
// least n tensors.
func SplitEvenly(tensors []TensorData, n int) [][]TensorData {
	if n < 1 {
		n = 1
	}
	var total uint64
	for _, t := range tensors {
		total += uint64(len(t.Data))
	}
	parts := make([][]TensorData, n)
	var done uint64
	p := 0
	for i, t := range tensors {
		// Move to the next part once this one has its share, but leave
		// enough tensors for the parts still empty.
		left := len(tensors) - i
		for p < n-1 && len(parts[p]) > 0 && (done >= total*uint64(p+1)/uint64(n) || left <= n-1-p) {
			p++
		}
		parts[p] = append(parts[p], t)
		done += uint64(len(t.Data))
	}
	return parts
}

// WriteSplit writes f as n parts named SplitPath(prefix, i, n), tensors in
// file order and spread evenly by size (see SplitEvenly). The data is
// copied from f's mapping, so f must stay open until it returns.
func (f *File) WriteSplit(prefix string, n int) ([]string, error) {
	if len(f.Tensors) < n {
		return nil, fmt.Errorf("gguf: %s: cannot split %d tensors into %d parts", f.Path, len(f.Tensors), n)
	}
	ts := make([]TensorData, len(f.Tensors))
	for i, t := range f.Tensors {
		ts[i] = TensorData{Name: t.Name, Type: t.Type, Dims: t.Dims, Data: t.Data}
	}
	return WriteSplit(prefix, f.KVs, SplitEvenly(ts, n))
}
