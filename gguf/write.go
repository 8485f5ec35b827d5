package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"sort"
)

// Writer writes a GGUF file in two steps: the header (metadata and tensor
// infos), then each tensor's data in offset order. Data is streamed, so a
// large model is written without holding it in memory.
//
//	w := gguf.NewWriter(out)
//	w.Set("general.architecture", gguf.String("llama"))
//	w.AddTensor("token_embd.weight", gguf.TypeQ4_K, []uint64{4096, 128256})
//	w.WriteHeader()
//	w.WriteTensor("token_embd.weight", data)
//	w.Close()
type Writer struct {
	Version uint32 // 2 or 3 (default 3)
	// Tail, when set, is written after the last tensor instead of the
	// default padding to the alignment (or after the header when there are
	// no tensors).
	Tail      []byte
	out       *bufio.Writer
	kvs       []KV
	kvIndex   map[string]int
	tensors   []TensorInfo
	byName    map[string]int
	nextOff   uint64
	pos       int64 // bytes written so far
	dataStart int64
	order     []int // tensor indices by offset
	written   int   // how many of order are written
	header    bool
}

// NewWriter writes a GGUF v3 file to out.
func NewWriter(out io.Writer) *Writer {
	return &Writer{Version: 3, out: bufio.NewWriterSize(out, 1<<20), kvIndex: map[string]int{}, byName: map[string]int{}}
}

// Set adds a metadata entry, or replaces the value of an existing key in place.
func (w *Writer) Set(key string, v Value) {
	if i, ok := w.kvIndex[key]; ok {
		w.kvs[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kvs)
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

func (w *Writer) alignment() uint64 {
	if i, ok := w.kvIndex["general.alignment"]; ok {
		if a, ok := w.kvs[i].Value.asUint(); ok && a > 0 && a&(a-1) == 0 {
			return a
		}
	}
	return DefaultAlignment
}

// AddTensor appends a tensor info placed after the previous one, aligned.
func (w *Writer) AddTensor(name string, t Type, dims []uint64) error {
	size, err := tensorSize(t, dims)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", name, err)
	}
	off := uint64(alignUp(int64(w.nextOff), int64(w.alignment())))
	return w.AddTensorAt(TensorInfo{Name: name, Type: t, Dims: dims, Offset: off, Size: size})
}

// AddTensorAt appends a tensor info with an explicit data offset (used to
// reproduce an existing file's layout).
func (w *Writer) AddTensorAt(ti TensorInfo) error {
	if w.header {
		return fmt.Errorf("gguf: tensor %q added after the header was written", ti.Name)
	}
	if _, dup := w.byName[ti.Name]; dup {
		return fmt.Errorf("gguf: duplicate tensor %q", ti.Name)
	}
	if !ti.Type.Known() {
		return fmt.Errorf("gguf: tensor %q: unknown type id %d", ti.Name, uint32(ti.Type))
	}
	if len(ti.Dims) == 0 || len(ti.Dims) > MaxDims {
		return fmt.Errorf("gguf: tensor %q: %d dimensions, want 1 to %d", ti.Name, len(ti.Dims), MaxDims)
	}
	size, err := tensorSize(ti.Type, ti.Dims)
	if err != nil {
		return fmt.Errorf("gguf: tensor %q: %w", ti.Name, err)
	}
	ti.Size = size
	ti.Dims = append([]uint64(nil), ti.Dims...)
	w.byName[ti.Name] = len(w.tensors)
	w.tensors = append(w.tensors, ti)
	if end := ti.Offset + size; end > w.nextOff {
		w.nextOff = end
	}
	return nil
}

func (w *Writer) write(b []byte) error {
	n, err := w.out.Write(b)
	w.pos += int64(n)
	return err
}

func (w *Writer) u32(x uint32) error { return w.write(binary.LittleEndian.AppendUint32(nil, x)) }
func (w *Writer) u64(x uint64) error { return w.write(binary.LittleEndian.AppendUint64(nil, x)) }
func (w *Writer) str(s string) error {
	if err := w.u64(uint64(len(s))); err != nil {
		return err
	}
	_, err := io.WriteString(w.out, s)
	w.pos += int64(len(s))
	return err
}

func (w *Writer) zeros(n int64) error {
	var z [4096]byte
	for n > 0 {
		k := min(n, int64(len(z)))
		if err := w.write(z[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// WriteHeader writes the magic, metadata and tensor infos, then pads to
// the start of the data section.
func (w *Writer) WriteHeader() error {
	if w.header {
		return fmt.Errorf("gguf: header written twice")
	}
	if w.Version != 2 && w.Version != 3 {
		return fmt.Errorf("gguf: cannot write version %d (2 or 3)", w.Version)
	}
	if err := w.check(); err != nil {
		return err
	}
	w.header = true
	buf := binary.LittleEndian.AppendUint32(nil, Magic)
	buf = binary.LittleEndian.AppendUint32(buf, w.Version)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(w.tensors)))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(w.kvs)))
	if err := w.write(buf); err != nil {
		return err
	}
	for _, kv := range w.kvs {
		if err := w.str(kv.Key); err != nil {
			return err
		}
		if err := w.u32(uint32(kv.Value.Type)); err != nil {
			return err
		}
		if err := w.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: metadata %q: %w", kv.Key, err)
		}
	}
	for _, t := range w.tensors {
		if err := w.str(t.Name); err != nil {
			return err
		}
		if err := w.u32(uint32(len(t.Dims))); err != nil {
			return err
		}
		for _, d := range t.Dims {
			if err := w.u64(d); err != nil {
				return err
			}
		}
		if err := w.u32(uint32(t.Type)); err != nil {
			return err
		}
		if err := w.u64(t.Offset); err != nil {
			return err
		}
	}
	w.dataStart = w.pos
	if len(w.tensors) > 0 {
		w.dataStart = alignUp(w.pos, int64(w.alignment()))
	}
	w.order = make([]int, len(w.tensors))
	for i := range w.order {
		w.order[i] = i
	}
	sort.SliceStable(w.order, func(a, b int) bool { return w.tensors[w.order[a]].Offset < w.tensors[w.order[b]].Offset })
	return w.zeros(w.dataStart - w.pos)
}

// check refuses to write a header that the reader would reject, so a bug
// in a tool shows up where the file is written rather than where it is read.
func (w *Writer) check() error {
	if i, ok := w.kvIndex["general.alignment"]; ok {
		v := w.kvs[i].Value
		a, _ := v.asUint()
		if v.Type != ValUint32 || a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("gguf: general.alignment must be a uint32 power of two, got %s %v", v.Type, v)
		}
	}
	a := w.alignment()
	order := make([]int, len(w.tensors))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool { return w.tensors[order[x]].Offset < w.tensors[order[y]].Offset })
	var prevEnd uint64
	prev := ""
	for _, i := range order {
		t := w.tensors[i]
		if t.Offset%a != 0 {
			return fmt.Errorf("gguf: tensor %q: offset %d is not a multiple of the alignment %d", t.Name, t.Offset, a)
		}
		if t.Offset < prevEnd && t.Size > 0 {
			return fmt.Errorf("gguf: tensor %q at offset %d overlaps tensor %q, which ends at %d", t.Name, t.Offset, prev, prevEnd)
		}
		if end := t.Offset + t.Size; end > prevEnd {
			prevEnd, prev = end, t.Name
		}
	}
	return nil
}

func (w *Writer) value(v Value) error {
	le := binary.LittleEndian
	switch x := v.v.(type) {
	case uint8:
		return w.write([]byte{x})
	case int8:
		return w.write([]byte{byte(x)})
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		return w.write([]byte{b})
	case uint16:
		return w.write(le.AppendUint16(nil, x))
	case int16:
		return w.write(le.AppendUint16(nil, uint16(x)))
	case uint32:
		return w.u32(x)
	case int32:
		return w.u32(uint32(x))
	case float32:
		return w.u32(math.Float32bits(x))
	case uint64:
		return w.u64(x)
	case int64:
		return w.u64(uint64(x))
	case float64:
		return w.u64(math.Float64bits(x))
	case string:
		return w.str(x)
	}
	if v.Type != ValArray {
		return fmt.Errorf("value of type %s holds %T", v.Type, v.v)
	}
	if err := w.u32(uint32(v.Elem)); err != nil {
		return err
	}
	if err := w.u64(uint64(v.Len())); err != nil {
		return err
	}
	var buf []byte
	switch a := v.v.(type) {
	case []uint8:
		buf = a
	case []int8:
		for _, e := range a {
			buf = append(buf, byte(e))
		}
	case []bool:
		for _, e := range a {
			b := byte(0)
			if e {
				b = 1
			}
			buf = append(buf, b)
		}
	case []uint16:
		for _, e := range a {
			buf = le.AppendUint16(buf, e)
		}
	case []int16:
		for _, e := range a {
			buf = le.AppendUint16(buf, uint16(e))
		}
	case []uint32:
		for _, e := range a {
			buf = le.AppendUint32(buf, e)
		}
	case []int32:
		for _, e := range a {
			buf = le.AppendUint32(buf, uint32(e))
		}
	case []float32:
		for _, e := range a {
			buf = le.AppendUint32(buf, math.Float32bits(e))
		}
	case []uint64:
		for _, e := range a {
			buf = le.AppendUint64(buf, e)
		}
	case []int64:
		for _, e := range a {
			buf = le.AppendUint64(buf, uint64(e))
		}
	case []float64:
		for _, e := range a {
			buf = le.AppendUint64(buf, math.Float64bits(e))
		}
	case []string:
		for _, e := range a {
			if err := w.str(e); err != nil {
				return err
			}
		}
	case []Value:
		for _, e := range a {
			if err := w.value(e); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("array holds %T", v.v)
	}
	return w.write(buf)
}

// Next is the name of the tensor whose data WriteTensor expects next.
func (w *Writer) Next() (string, bool) {
	if !w.header || w.written >= len(w.order) {
		return "", false
	}
	return w.tensors[w.order[w.written]].Name, true
}

// Tensors lists the tensor infos in header order.
func (w *Writer) Tensors() []TensorInfo { return w.tensors }

// WriteTensor writes the data of the next tensor in offset order; name must
// be that tensor (see Next) and data exactly its size.
func (w *Writer) WriteTensor(name string, data []byte) error {
	want, ok := w.Next()
	if !ok {
		return fmt.Errorf("gguf: tensor %q: no tensor data expected (header not written, or all written)", name)
	}
	if want != name {
		return fmt.Errorf("gguf: tensor %q written out of order: %q is next", name, want)
	}
	t := w.tensors[w.order[w.written]]
	if uint64(len(data)) != t.Size {
		return fmt.Errorf("gguf: tensor %q: %d bytes of data, want %d", name, len(data), t.Size)
	}
	if t.Size == 0 {
		// An empty tensor occupies no bytes, so it may sit at any aligned
		// offset, even inside another tensor; there is nothing to write.
		w.written++
		return nil
	}
	if gap := w.dataStart + int64(t.Offset) - w.pos; gap > 0 {
		if err := w.zeros(gap); err != nil {
			return err
		}
	} else if gap < 0 {
		return fmt.Errorf("gguf: tensor %q overlaps the previous tensor", name)
	}
	if err := w.write(data); err != nil {
		return err
	}
	w.written++
	return nil
}

// Close checks that every tensor was written, pads the data section to the
// alignment (as llama.cpp does) and flushes.
func (w *Writer) Close() error {
	if !w.header {
		if err := w.WriteHeader(); err != nil {
			return err
		}
	}
	if name, ok := w.Next(); ok {
		return fmt.Errorf("gguf: closed before tensor %q was written", name)
	}
	if w.Tail != nil {
		if len(w.tensors) > 0 {
			if err := w.zeros(w.dataStart + int64(w.nextOff) - w.pos); err != nil {
				return err
			}
		}
		if err := w.write(w.Tail); err != nil {
			return err
		}
	} else if len(w.tensors) > 0 {
		end := w.dataStart + alignUp(int64(w.nextOff), int64(w.alignment()))
		if err := w.zeros(end - w.pos); err != nil {
			return err
		}
	}
	return w.out.Flush()
}

// WriteTo writes f back out: metadata and tensor infos re-encoded from what
// was read, tensor data copied at the original offsets. For a single-part
// file written by llama.cpp or ats this reproduces the file byte for byte.
func (f *File) WriteTo(out io.Writer) (int64, error) {
	if len(f.Parts) != 1 {
		return 0, fmt.Errorf("gguf: %s: WriteTo writes single-part files; this model has %d parts", f.Path, len(f.Parts))
	}
	p := f.Parts[0]
	cw := &countWriter{w: out}
	w := NewWriter(cw)
	w.Version = p.Version
	w.Tail = p.Tail
	if w.Tail == nil {
		w.Tail = []byte{}
	}
	if p.Version < 2 {
		w.Version = 3
	}
	for _, kv := range p.KVs {
		w.Set(kv.Key, kv.Value)
	}
	for _, ti := range p.Tensors {
		if err := w.AddTensorAt(ti); err != nil {
			return cw.n, err
		}
	}
	if err := w.WriteHeader(); err != nil {
		return cw.n, err
	}
	for {
		name, ok := w.Next()
		if !ok {
			break
		}
		t, _ := f.Tensor(name)
		if err := w.WriteTensor(name, t.Data); err != nil {
			return cw.n, err
		}
	}
	err := w.Close()
	return cw.n, err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// EncodeHeader returns the bytes WriteHeader writes for these metadata and
// tensor infos (magic through tensor infos, padded to the data section),
// for writers that stream tensor data in pieces of their own and need the
// header, and so the file size, up front (tools/synth).
func EncodeHeader(version uint32, kvs []KV, tensors []TensorInfo) ([]byte, error) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Version = version
	for _, kv := range kvs {
		w.Set(kv.Key, kv.Value)
	}
	for _, t := range tensors {
		if err := w.AddTensorAt(t); err != nil {
			return nil, err
		}
	}
	if err := w.WriteHeader(); err != nil {
		return nil, err
	}
	if err := w.out.Flush(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
