package kvcache

import (
	"fmt"
	"strings"
)

// Type is how a cache cell stores its key and value rows.
type Type uint8

const (
	F16  Type = iota // binary16, llama.cpp's default
	Q8_0             // ggml's Q8_0 blocks: an f16 scale and 32 int8 values (34 bytes per 32)
	Q4_0             // ggml's Q4_0 blocks: an f16 scale and 32 4-bit values (18 bytes per 32)
	F32              // float32 (the CPU only; tests)
)

var typeNames = [...]string{F16: "f16", Q8_0: "q8_0", Q4_0: "q4_0", F32: "f32"}

func (t Type) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("kvtype(%d)", t)
}

// ParseType reads a cache type as llama.cpp's -ctk/-ctv name it.
func ParseType(s string) (Type, error) {
	for t, n := range typeNames {
		if strings.EqualFold(s, n) {
			return Type(t), nil
		}
	}
	return 0, fmt.Errorf("KV cache type %q: want one of %s", s, strings.Join(typeNames[:], ", "))
}

// Quantized says whether the type stores blocks of 32 values.
func (t Type) Quantized() bool { return t == Q8_0 || t == Q4_0 }

// RowBytes is the size of one row of width values (width a multiple of 32
// for the quantized types).
func (t Type) RowBytes(width int) int64 {
	switch t {
	case Q8_0:
		return int64(width/32) * 34
	case Q4_0:
		return int64(width/32) * 18
	case F32:
		return 4 * int64(width)
	}
	return 2 * int64(width)
}

// CheckWidth reports whether rows of width values can be stored as t.
func (t Type) CheckWidth(width int) error {
	if t.Quantized() && width%32 != 0 {
		return fmt.Errorf("a %s KV cache needs rows of a multiple of 32 values; this model's are %d", t, width)
	}
	return nil
}
