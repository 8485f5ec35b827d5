package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"
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
		left := d.remaining()
		d.pos = start
		return 0, d.fail(field, "count %d cannot fit in the %d bytes left (each item takes at least %d)", n, left, minItem)
	}
	return int64(n), nil
}

// withField renames the field of a ParseError. Loops over many items read
// with a short field name and spell out the full one (which costs a
// fmt.Sprintf) only when something failed, so a 150k-token vocabulary does
// not format 150k names.
func withField(err error, field string) error {
	if pe, ok := err.(*ParseError); ok {
		pe.Field = field
	}
	return err
}

// minStr is the encoded size of an empty string: its length field.
func minStr(version uint32) int64 {
	if version == 1 {
		return 4
	}
	return 8
}

func (d *decoder) str(version uint32, field string) (string, error) {
	n, err := d.count(version, 1, field)
	if err != nil {
		return "", withField(err, field+" length")
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
	// The smallest encoding of one element bounds the count: a string is at
	// least its length field, a nested array its type and count fields.
	minItem := int64(et.scalarSize())
	switch et {
	case ValString:
		minItem = minStr(version)
	case ValArray:
		minItem = 4 + minStr(version)
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
		// Two passes: the first checks every length and totals the bytes,
		// the second copies them into one buffer that all the strings
		// share. A 128k-token vocabulary with 280k merges otherwise costs
		// 400k allocations, which dominates opening a model.
		start := d.pos
		var total int64
		for i := range n {
			l, err := d.count(version, 1, field)
			if err != nil {
				return Value{}, withField(err, fmt.Sprintf("%s[%d] length", field, i))
			}
			d.pos += l
			total += l
		}
		d.pos = start
		var sb strings.Builder
		sb.Grow(int(total))
		ends := make([]int, n) // end of each string in sb; n <= bytes left / 8
		for i := range ends {
			l, _ := d.count(version, 1, field) // checked above
			sb.Write(d.b[d.pos : d.pos+l])
			d.pos += l
			ends[i] = sb.Len()
		}
		all := sb.String()
		a := make([]string, n)
		prev := 0
		for i, e := range ends {
			a[i] = all[prev:e]
			prev = e
		}
		out = a
	case ValArray:
		a := make([]Value, n)
		for i := range a {
			if a[i], err = d.array(version, field, depth+1); err != nil {
				// Nested errors already name a sub-field of field; keep the
				// suffix and put the index in front of it.
				if pe, ok := err.(*ParseError); ok && strings.HasPrefix(pe.Field, field) {
					pe.Field = fmt.Sprintf("%s[%d]%s", field, i, pe.Field[len(field):])
				}
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
	// The smallest tensor info is a name length, a dimension count, one
	// dimension, a type and an offset; the smallest metadata entry is a key
	// length, a value type and a one-byte value. Counts that cannot fit in
	// the file are rejected before anything is allocated for them.
	ls := minStr(h.version)
	nTensors, err := d.count(h.version, ls+4+ls+4+8, "tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.count(h.version, ls+4+1, "metadata count")
	if err != nil {
		return nil, err
	}
	h.kvs = make([]KV, 0, nKV)
	seen := make(map[string]bool, nKV)
	for i := int64(0); i < nKV; i++ {
		keyAt := d.pos
		key, err := d.str(h.version, "key")
		if err != nil {
			return nil, withField(err, fmt.Sprintf("metadata[%d] key length", i))
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
			// llama.cpp reads the alignment with gguf_get_val_u32, so any
			// other type is as malformed as a value that is not a power of two.
			a, ok := v.asUint()
			if !ok || v.Type != ValUint32 || a == 0 || a&(a-1) != 0 {
				d.pos = tAt
				return nil, d.fail(key, "alignment must be a uint32 power of two, got %s %v", v.Type, v)
			}
			h.alignment = a
		}
		h.kvs = append(h.kvs, KV{Key: key, Value: v})
	}
	h.tensors = make([]TensorInfo, 0, nTensors)
	names := make(map[string]bool, nTensors)
	for i := int64(0); i < nTensors; i++ {
		at := d.pos
		ti, err := d.tensorInfo(h.version, h.alignment)
		if err != nil {
			// tensorInfo names fields relative to the tensor ("dim 1");
			// prefix them with the tensor's name, or its index when the
			// name itself could not be read.
			if pe, ok := err.(*ParseError); ok {
				if ti.Name == "" && pe.Field == "name length" {
					pe.Field = fmt.Sprintf("tensor[%d] name length", i)
				} else {
					pe.Field = fmt.Sprintf("tensor %q %s", ti.Name, pe.Field)
				}
			}
			return nil, err
		}
		if names[ti.Name] {
			d.pos = at
			return nil, d.fail(fmt.Sprintf("tensor[%d] name", i), "duplicate tensor name %q", ti.Name)
		}
		names[ti.Name] = true
		h.tensors = append(h.tensors, ti)
	}
	headerEnd := d.pos
	h.dataOffset = alignUp(d.pos, int64(h.alignment))
	if nTensors > 0 && h.dataOffset > int64(len(b)) {
		return nil, d.fail("data section", "starts at %d, past the end of the file (%d bytes; truncated?)", h.dataOffset, len(b))
	}
	dataLen := uint64(max(0, int64(len(b))-h.dataOffset))
	// Tensors must lie inside the data section and must not overlap. The
	// check runs in offset order so it costs n log n, not n².
	order := make([]int, len(h.tensors))
	for i := range order {
		order[i] = i
	}
	// Stable, so that of two tensors at one offset the later in the header
	// is the one reported.
	sort.SliceStable(order, func(a, b int) bool { return h.tensors[order[a]].Offset < h.tensors[order[b]].Offset })
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

// tensorInfo reads one tensor info. Its errors name fields relative to the
// tensor; parse prefixes them. On error the returned info holds the name
// when that much was read.
func (d *decoder) tensorInfo(version uint32, alignment uint64) (TensorInfo, error) {
	var ti TensorInfo
	at := d.pos
	name, err := d.str(version, "name")
	if err != nil {
		return ti, err
	}
	ti.Name = name
	nd, err := d.u32("dimension count")
	if err != nil {
		return ti, err
	}
	if nd == 0 || nd > MaxDims {
		d.pos -= 4
		return ti, d.fail("dimension count", "%d dimensions, want 1 to %d", nd, MaxDims)
	}
	var dims [MaxDims]uint64
	for j := range nd {
		var x uint64
		if version == 1 {
			var x32 uint32
			x32, err = d.u32("dim")
			x = uint64(x32)
		} else {
			x, err = d.u64("dim")
		}
		if err != nil {
			return ti, withField(err, fmt.Sprintf("dim %d", j))
		}
		dims[j] = x
	}
	ti.Dims = append([]uint64(nil), dims[:nd]...)
	typAt := d.pos
	typ, err := d.u32("type")
	if err != nil {
		return ti, err
	}
	ti.Type = Type(typ)
	if !ti.Type.Known() {
		d.pos = typAt
		return ti, d.fail("type", "unknown ggml type id %d", typ)
	}
	offAt := d.pos
	if ti.Offset, err = d.u64("offset"); err != nil {
		return ti, err
	}
	if ti.Offset%alignment != 0 {
		d.pos = offAt
		return ti, d.fail("offset", "offset %d is not a multiple of the alignment %d", ti.Offset, alignment)
	}
	if ti.Size, err = tensorSize(ti.Type, ti.Dims); err != nil {
		d.pos = at
		return ti, d.fail("shape", "%v", err)
	}
	return ti, nil
}

// tensorSize is the byte size of a tensor, rejecting shapes whose element
// count overflows or whose rows are not whole blocks.
func tensorSize(t Type, dims []uint64) (uint64, error) {
	ti, ok := t.Info()
	if !ok {
		return 0, fmt.Errorf("unknown ggml type id %d", uint32(t))
	}
	if len(dims) == 0 || len(dims) > MaxDims {
		return 0, fmt.Errorf("%d dimensions, want 1 to %d", len(dims), MaxDims)
	}
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
