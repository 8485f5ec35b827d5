package synth

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/atsinfer/ats/gguf"
)

// The GGUF header is encoded here rather than through gguf.Writer because
// that writer takes each tensor's data as one slice, and a synthetic tensor
// can be gigabytes (an f32 output matrix of Qwen3-14B is 3.1 GB): synth
// streams every tensor in chunks of a few MiB instead. The bytes are the
// same as gguf.Writer's (GGUF v3, default alignment 32); TestHeaderMatchesWriter
// holds the two together. A streaming tensor API in package gguf would
// let this file go.

const ggufAlignment = gguf.DefaultAlignment // general.alignment is not set

// tensorInfo is a tensor's header entry.
type tensorInfo struct {
	name   string
	typ    gguf.Type
	dims   []uint64
	offset uint64 // from the start of the data section
	size   uint64
}

// encodeHeader encodes the header of a GGUF v3 file (magic, version,
// counts, metadata, tensor infos) and pads it to the data section.
func encodeHeader(kvs []gguf.KV, tensors []tensorInfo) ([]byte, error) {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, gguf.Magic)
	b = le.AppendUint32(b, 3)
	b = le.AppendUint64(b, uint64(len(tensors)))
	b = le.AppendUint64(b, uint64(len(kvs)))
	var err error
	for _, kv := range kvs {
		b = appendString(b, kv.Key)
		b = le.AppendUint32(b, uint32(kv.Value.Type))
		if b, err = appendValue(b, kv.Value); err != nil {
			return nil, fmt.Errorf("synth: metadata %q: %w", kv.Key, err)
		}
	}
	for _, t := range tensors {
		b = appendString(b, t.name)
		b = le.AppendUint32(b, uint32(len(t.dims)))
		for _, d := range t.dims {
			b = le.AppendUint64(b, d)
		}
		b = le.AppendUint32(b, uint32(t.typ))
		b = le.AppendUint64(b, t.offset)
	}
	if len(tensors) > 0 {
		b = append(b, make([]byte, alignUp(uint64(len(b)))-uint64(len(b)))...)
	}
	return b, nil
}

func alignUp(n uint64) uint64 { return (n + ggufAlignment - 1) / ggufAlignment * ggufAlignment }

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// appendValue encodes a value's payload (its type tag is written by the
// caller, or by the enclosing array).
func appendValue(b []byte, v gguf.Value) ([]byte, error) {
	le := binary.LittleEndian
	switch x := v.Data().(type) {
	case uint8:
		return append(b, x), nil
	case int8:
		return append(b, byte(x)), nil
	case bool:
		return append(b, boolByte(x)), nil
	case uint16:
		return le.AppendUint16(b, x), nil
	case int16:
		return le.AppendUint16(b, uint16(x)), nil
	case uint32:
		return le.AppendUint32(b, x), nil
	case int32:
		return le.AppendUint32(b, uint32(x)), nil
	case float32:
		return le.AppendUint32(b, math.Float32bits(x)), nil
	case uint64:
		return le.AppendUint64(b, x), nil
	case int64:
		return le.AppendUint64(b, uint64(x)), nil
	case float64:
		return le.AppendUint64(b, math.Float64bits(x)), nil
	case string:
		return appendString(b, x), nil
	}
	if v.Type != gguf.ValArray {
		return nil, fmt.Errorf("value of type %s holds %T", v.Type, v.Data())
	}
	b = le.AppendUint32(b, uint32(v.Elem))
	b = le.AppendUint64(b, uint64(v.Len()))
	switch a := v.Data().(type) {
	case []uint8:
		b = append(b, a...)
	case []int8:
		for _, e := range a {
			b = append(b, byte(e))
		}
	case []bool:
		for _, e := range a {
			b = append(b, boolByte(e))
		}
	case []uint16:
		for _, e := range a {
			b = le.AppendUint16(b, e)
		}
	case []int16:
		for _, e := range a {
			b = le.AppendUint16(b, uint16(e))
		}
	case []uint32:
		for _, e := range a {
			b = le.AppendUint32(b, e)
		}
	case []int32:
		for _, e := range a {
			b = le.AppendUint32(b, uint32(e))
		}
	case []float32:
		for _, e := range a {
			b = le.AppendUint32(b, math.Float32bits(e))
		}
	case []uint64:
		for _, e := range a {
			b = le.AppendUint64(b, e)
		}
	case []int64:
		for _, e := range a {
			b = le.AppendUint64(b, uint64(e))
		}
	case []float64:
		for _, e := range a {
			b = le.AppendUint64(b, math.Float64bits(e))
		}
	case []string:
		for _, e := range a {
			b = appendString(b, e)
		}
	case []gguf.Value:
		for _, e := range a {
			var err error
			if b, err = appendValue(b, e); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("array holds %T", v.Data())
	}
	return b, nil
}

func boolByte(x bool) byte {
	if x {
		return 1
	}
	return 0
}
