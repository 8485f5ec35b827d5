package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// Magic is the first four bytes of every GGUF file ("GGUF" little-endian).
const Magic = 0x46554747

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// MaxDims is the most dimensions a ggml tensor has.
const MaxDims = 4

// maxArrayDepth bounds arrays of arrays so a hostile file cannot recurse deeply.
const maxArrayDepth = 8

// ParseError reports malformed input: the byte offset and the field that
// could not be read.
type ParseError struct {
	File   string
	Offset int64
	Field  string
	Msg    string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("gguf: %s: offset %d: %s: %s", e.File, e.Offset, e.Field, e.Msg)
}

// decoder reads little-endian fields from an in-memory (usually mmapped)
// file, checking every length against the bytes that remain.
type decoder struct {
	file string
	b    []byte
	pos  int64
}

func (d *decoder) fail(field, format string, args ...any) error {
	return &ParseError{File: d.file, Offset: d.pos, Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) remaining() int64 { return int64(len(d.b)) - d.pos }

func (d *decoder) need(n int64, field string) error {
	if n < 0 || n > d.remaining() {
		return d.fail(field, "needs %d bytes, %d left in the file (truncated?)", n, d.remaining())
	}
	return nil
}

func (d *decoder) u8(field string) (uint8, error) {
	if err := d.need(1, field); err != nil {
		return 0, err
	}
	x := d.b[d.pos]
	d.pos++
	return x, nil
}

func (d *decoder) u16(field string) (uint16, error) {
	if err := d.need(2, field); err != nil {
		return 0, err
	}
	x := binary.LittleEndian.Uint16(d.b[d.pos:])
	d.pos += 2
	return x, nil
}

func (d *decoder) u32(field string) (uint32, error) {
	if err := d.need(4, field); err != nil {
		return 0, err
	}
	x := binary.LittleEndian.Uint32(d.b[d.pos:])
	d.pos += 4
	return x, nil
}

func (d *decoder) u64(field string) (uint64, error) {
	if err := d.need(8, field); err != nil {
		return 0, err
	}
	x := binary.LittleEndian.Uint64(d.b[d.pos:])
	d.pos += 8
	return x, nil
}

// count reads a length field: uint32 in GGUF v1, uint64 from v2 on. Each
// counted item takes at least minItem bytes, so a count that cannot fit in
// the rest of the file is rejected before anything is allocated.
func (d *decoder) count(version uint32, minItem int64, field string) (int64, error) {
	start := d.pos
	var n uint64
	if version == 1 {
		x, err := d.u32(field)
		if err != nil {
			return 0, err
		}
		n = uint64(x)
	} else {
		x, err := d.u64(field)
		if err != nil {
			return 0, err
		}
		n = x
	}
	if minItem > 0 && n > uint64(d.remaining()/minItem) {
		d.pos = start
		return 0, d.fail(field, "count %d cannot fit in the %d bytes left", n, d.remaining()-8)
	}
	return int64(n), nil
}

func (d *decoder) str(version uint32, field string) (string, error) {
	n, err := d.count(version, 1, field+" length")
	if err != nil {
		return "", err
	}
	s := string(d.b[d.pos : d.pos+n])
	d.pos += n
	return s, nil
}

func (d *decoder) value(version uint32, t ValueType, field string, depth int) (Value, error) {
	switch t {
	case ValUint8:
		x, err := d.u8(field)
		return Uint8(x), err
	case ValInt8:
		x, err := d.u8(field)
		return Int8(int8(x)), err
	case ValUint16:
		x, err := d.u16(field)
		return Uint16(x), err
	case ValInt16:
		x, err := d.u16(field)
		return Int16(int16(x)), err
	case ValUint32:
		x, err := d.u32(field)
		return Uint32(x), err
	case ValInt32:
		x, err := d.u32(field)
		return Int32(int32(x)), err
	case ValFloat32:
		x, err := d.u32(field)
		return Float32(math.Float32frombits(x)), err
	case ValBool:
		at := d.pos
		x, err := d.u8(field)
		if err == nil && x > 1 {
			d.pos = at
			return Value{}, d.fail(field, "bool byte is %d, want 0 or 1", x)
		}
		return Bool(x == 1), err
	case ValString:
		s, err := d.str(version, field)
		return String(s), err
	case ValUint64:
		x, err := d.u64(field)
		return Uint64(x), err
	case ValInt64:
		x, err := d.u64(field)
		return Int64(int64(x)), err
	case ValFloat64:
		x, err := d.u64(field)
		return Float64(math.Float64frombits(x)), err
	case ValArray:
		return d.array(version, field, depth+1)
	}
	return Value{}, d.fail(field, "unknown value type %d", uint32(t))
}

func (d *decoder) array(version uint32, field string, depth int) (Value, error) {
	if depth > maxArrayDepth {
		return Value{}, d.fail(field, "arrays nested deeper than %d", maxArrayDepth)
	}
	at := d.pos
	et32, err := d.u32(field + " element type")
	if err != nil {
		return Value{}, err
	}
	et := ValueType(et32)
	if !et.valid() {
		d.pos = at
		return Value{}, d.fail(field+" element type", "unknown value type %d", et32)
	}
	minItem := int64(et.scalarSize())
	switch et {
	case ValString:
		minItem = 4
		if version > 1 {
			minItem = 8
		}
	case ValArray:
		minItem = 12
		if version == 1 {
			minItem = 8
		}
	}
	n, err := d.count(version, minItem, field+" element count")
	if err != nil {
		return Value{}, err
	}
	le := binary.LittleEndian
	raw := func(size int64) []byte { b := d.b[d.pos : d.pos+n*size]; d.pos += n * size; return b }
	var out any
	switch et {
	case ValUint8:
		out = append([]uint8(nil), raw(1)...)
	case ValInt8:
		b := raw(1)
		a := make([]int8, n)
		for i := range a {
			a[i] = int8(b[i])
		}
		out = a
	case ValBool:
		b := raw(1)
		a := make([]bool, n)
		for i := range a {
			if b[i] > 1 {
				d.pos = d.pos - n + int64(i)
				return Value{}, d.fail(field, "bool element %d is %d, want 0 or 1", i, b[i])
			}
			a[i] = b[i] == 1
		}
		out = a
	case ValUint16:
		b := raw(2)
		a := make([]uint16, n)
		for i := range a {
			a[i] = le.Uint16(b[2*i:])
		}
		out = a
	case ValInt16:
		b := raw(2)
		a := make([]int16, n)
		for i := range a {
			a[i] = int16(le.Uint16(b[2*i:]))
		}
		out = a
	case ValUint32:
		b := raw(4)
		a := make([]uint32, n)
		for i := range a {
			a[i] = le.Uint32(b[4*i:])
		}
		out = a
	case ValInt32:
		b := raw(4)
		a := make([]int32, n)
		for i := range a {
			a[i] = int32(le.Uint32(b[4*i:]))
		}
		out = a
	case ValFloat32:
		b := raw(4)
		a := make([]float32, n)
		for i := range a {
			a[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
		out = a
	case ValUint64:
		b := raw(8)
		a := make([]uint64, n)
		for i := range a {
			a[i] = le.Uint64(b[8*i:])
		}
		out = a
	case ValInt64:
		b := raw(8)
		a := make([]int64, n)
		for i := range a {
			a[i] = int64(le.Uint64(b[8*i:]))
		}
		out = a
	case ValFloat64:
		b := raw(8)
		a := make([]float64, n)
		for i := range a {
			a[i] = math.Float64frombits(le.Uint64(b[8*i:]))
		}
		out = a
	case ValString:
		a := make([]string, n)
		for i := range a {
			if a[i], err = d.str(version, fmt.Sprintf("%s[%d]", field, i)); err != nil {
				return Value{}, err
			}
		}
		out = a
	case ValArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = d.array(version, fmt.Sprintf("%s[%d]", field, i), depth+1); err != nil {
				return Value{}, err
			}
		}
		out = a
	}
	return Value{Type: ValArray, Elem: et, v: out}, nil
}

// header is what parse reads from one file.
type header struct {
	version    uint32
	kvs        []KV
	tensors    []TensorInfo
	alignment  uint64
	dataOffset int64  // start of the data section in the file
	tail       []byte // bytes after the header (no tensors) or after the last tensor
}

func parse(name string, b []byte) (*header, error) {
	d := &decoder{file: name, b: b}
	magic, err := d.u32("magic")
	if err != nil {
		return nil, err
	}
	if magic != Magic {
		d.pos = 0
		return nil, d.fail("magic", "got %q, want \"GGUF\" (not a GGUF file)", b[:4])
	}
	h := &header{alignment: DefaultAlignment}
	if h.version, err = d.u32("version"); err != nil {
		return nil, err
	}
	if h.version < 1 || h.version > 3 {
		d.pos -= 4
		return nil, d.fail("version", "unsupported GGUF version %d (ats reads 1 to 3)", h.version)
	}
	// Each tensor info takes at least 8+4+8+4+8 bytes, each KV at least 8+4+1.
	nTensors, err := d.count(h.version, 28, "tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.count(h.version, 13, "metadata count")
	if err != nil {
		return nil, err
	}
	h.kvs = make([]KV, 0, nKV)
	seen := make(map[string]bool, nKV)
	for i := int64(0); i < nKV; i++ {
		keyAt := d.pos
		key, err := d.str(h.version, fmt.Sprintf("metadata[%d] key", i))
		if err != nil {
			return nil, err
		}
		if seen[key] {
			d.pos = keyAt
			return nil, d.fail(fmt.Sprintf("metadata[%d] key", i), "duplicate key %q", key)
		}
		seen[key] = true
		tAt := d.pos
		t, err := d.u32(key + " value type")
		if err != nil {
			return nil, err
		}
		if !ValueType(t).valid() {
			d.pos = tAt
			return nil, d.fail(key+" value type", "unknown value type %d", t)
		}
		v, err := d.value(h.version, ValueType(t), key, 0)
		if err != nil {
			return nil, err
		}
		if key == "general.alignment" {
			a, ok := v.asUint()
			if !ok || v.Type != ValUint32 || a == 0 || a&(a-1) != 0 {
				d.pos = tAt
				return nil, d.fail(key, "alignment must be a uint32 power of two, got %s %v", v.Type, v.v)
			}
			h.alignment = a
		}
		h.kvs = append(h.kvs, KV{Key: key, Value: v})
	}
	h.tensors = make([]TensorInfo, 0, nTensors)
	names := make(map[string]bool, nTensors)
	for i := int64(0); i < nTensors; i++ {
		field := fmt.Sprintf("tensor[%d]", i)
		at := d.pos
		name, err := d.str(h.version, field+" name")
		if err != nil {
			return nil, err
		}
		if names[name] {
			d.pos = at
			return nil, d.fail(field+" name", "duplicate tensor name %q", name)
		}
		names[name] = true
		field = fmt.Sprintf("tensor %q", name)
		nd, err := d.u32(field + " dimension count")
		if err != nil {
			return nil, err
		}
		if nd == 0 || nd > MaxDims {
			d.pos -= 4
			return nil, d.fail(field+" dimension count", "%d dimensions, want 1 to %d", nd, MaxDims)
		}
		ti := TensorInfo{Name: name, Dims: make([]uint64, nd)}
		for j := range ti.Dims {
			if h.version == 1 {
				x, err := d.u32(fmt.Sprintf("%s dim %d", field, j))
				if err != nil {
					return nil, err
				}
				ti.Dims[j] = uint64(x)
			} else if ti.Dims[j], err = d.u64(fmt.Sprintf("%s dim %d", field, j)); err != nil {
				return nil, err
			}
		}
		typAt := d.pos
		typ, err := d.u32(field + " type")
		if err != nil {
			return nil, err
		}
		ti.Type = Type(typ)
		if !ti.Type.Known() {
			d.pos = typAt
			return nil, d.fail(field+" type", "unknown ggml type id %d", typ)
		}
		offAt := d.pos
		if ti.Offset, err = d.u64(field + " offset"); err != nil {
			return nil, err
		}
		if ti.Offset%h.alignment != 0 {
			d.pos = offAt
			return nil, d.fail(field+" offset", "offset %d is not a multiple of the alignment %d", ti.Offset, h.alignment)
		}
		if ti.Size, err = tensorSize(ti.Type, ti.Dims); err != nil {
			d.pos = at
			return nil, d.fail(field+" shape", "%v", err)
		}
		h.tensors = append(h.tensors, ti)
	}
	headerEnd := d.pos
	h.dataOffset = alignUp(d.pos, int64(h.alignment))
	if nTensors > 0 && h.dataOffset > int64(len(b)) {
		return nil, d.fail("data section", "starts at %d, past the end of the file (%d bytes)", h.dataOffset, len(b))
	}
	dataLen := uint64(max(0, int64(len(b))-h.dataOffset))
	// Tensors must lie inside the data section and must not overlap.
	order := make([]int, len(h.tensors))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return h.tensors[order[a]].Offset < h.tensors[order[b]].Offset })
	var prevEnd uint64
	prev := ""
	for _, i := range order {
		t := &h.tensors[i]
		end := t.Offset + t.Size
		if end < t.Offset || end > dataLen {
			return nil, &ParseError{File: name, Offset: h.dataOffset + int64(min(t.Offset, dataLen)), Field: fmt.Sprintf("tensor %q data", t.Name),
				Msg: fmt.Sprintf("%d bytes at data offset %d run past the end of the data section (%d bytes; truncated file?)", t.Size, t.Offset, dataLen)}
		}
		if t.Offset < prevEnd && t.Size > 0 {
			return nil, &ParseError{File: name, Offset: h.dataOffset + int64(t.Offset), Field: fmt.Sprintf("tensor %q data", t.Name),
				Msg: fmt.Sprintf("overlaps tensor %q, which ends at data offset %d", prev, prevEnd)}
		}
		if end > prevEnd {
			prevEnd, prev = end, t.Name
		}
	}
	if len(h.tensors) == 0 {
		h.tail = b[headerEnd:]
	} else {
		h.tail = b[h.dataOffset+int64(prevEnd):]
	}
	return h, nil
}

// tensorSize is the byte size of a tensor, rejecting shapes whose element
// count overflows or whose rows are not whole blocks.
func tensorSize(t Type, dims []uint64) (uint64, error) {
	ti, _ := t.Info()
	n := uint64(1)
	for _, x := range dims {
		if x != 0 && n > math.MaxInt64/x {
			return 0, fmt.Errorf("element count of %v overflows", dims)
		}
		n *= x
	}
	if dims[0]%uint64(ti.BlockSize) != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of the %s block size %d", dims[0], ti.Name, ti.BlockSize)
	}
	blocks := n / uint64(ti.BlockSize)
	if blocks > math.MaxInt64/uint64(ti.BlockBytes) {
		return 0, fmt.Errorf("size of %v %s overflows", dims, ti.Name)
	}
	return blocks * uint64(ti.BlockBytes), nil
}

func alignUp(x, a int64) int64 { return (x + a - 1) / a * a }
