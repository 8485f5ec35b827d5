package gguf

import "fmt"

// Type is a ggml tensor type id as stored in a GGUF tensor info.
type Type uint32

// The ggml type ids. Gaps are ids that ggml retired (Q4_2, Q4_3, the
// interleaved Q4_0_4_4 family); a file that uses one is rejected.
const (
	TypeF32     Type = 0
	TypeF16     Type = 1
	TypeQ4_0    Type = 2
	TypeQ4_1    Type = 3
	TypeQ5_0    Type = 6
	TypeQ5_1    Type = 7
	TypeQ8_0    Type = 8
	TypeQ8_1    Type = 9
	TypeQ2_K    Type = 10
	TypeQ3_K    Type = 11
	TypeQ4_K    Type = 12
	TypeQ5_K    Type = 13
	TypeQ6_K    Type = 14
	TypeQ8_K    Type = 15
	TypeIQ2_XXS Type = 16
	TypeIQ2_XS  Type = 17
	TypeIQ3_XXS Type = 18
	TypeIQ1_S   Type = 19
	TypeIQ4_NL  Type = 20
	TypeIQ3_S   Type = 21
	TypeIQ2_S   Type = 22
	TypeIQ4_XS  Type = 23
	TypeI8      Type = 24
	TypeI16     Type = 25
	TypeI32     Type = 26
	TypeI64     Type = 27
	TypeF64     Type = 28
	TypeIQ1_M   Type = 29
	TypeBF16    Type = 30
	TypeTQ1_0   Type = 34
	TypeTQ2_0   Type = 35
	TypeMXFP4   Type = 39
)

// QK_K is the super-block size of the k-quants and most IQ types.
const QK_K = 256

// TypeInfo describes how a type packs elements: BlockBytes bytes hold
// BlockSize consecutive elements of a row.
type TypeInfo struct {
	Name       string
	BlockSize  int
	BlockBytes int
	Quantized  bool
}

var typeTable = map[Type]TypeInfo{
	TypeF32:     {"F32", 1, 4, false},
	TypeF16:     {"F16", 1, 2, false},
	TypeQ4_0:    {"Q4_0", 32, 2 + 16, true},
	TypeQ4_1:    {"Q4_1", 32, 2 + 2 + 16, true},
	TypeQ5_0:    {"Q5_0", 32, 2 + 4 + 16, true},
	TypeQ5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16, true},
	TypeQ8_0:    {"Q8_0", 32, 2 + 32, true},
	TypeQ8_1:    {"Q8_1", 32, 2 + 2 + 32, true},
	TypeQ2_K:    {"Q2_K", QK_K, QK_K/16 + QK_K/4 + 2 + 2, true},
	TypeQ3_K:    {"Q3_K", QK_K, QK_K/8 + QK_K/4 + 12 + 2, true},
	TypeQ4_K:    {"Q4_K", QK_K, 2 + 2 + 12 + QK_K/2, true},
	TypeQ5_K:    {"Q5_K", QK_K, 2 + 2 + 12 + QK_K/8 + QK_K/2, true},
	TypeQ6_K:    {"Q6_K", QK_K, QK_K/2 + QK_K/4 + QK_K/16 + 2, true},
	TypeQ8_K:    {"Q8_K", QK_K, 4 + QK_K + QK_K/16*2, true},
	TypeIQ2_XXS: {"IQ2_XXS", QK_K, 2 + QK_K/8*2, true},
	TypeIQ2_XS:  {"IQ2_XS", QK_K, 2 + QK_K/8*2 + QK_K/32, true},
	TypeIQ3_XXS: {"IQ3_XXS", QK_K, 2 + 3*QK_K/8, true},
	TypeIQ1_S:   {"IQ1_S", QK_K, 2 + QK_K/8 + QK_K/32*2, true},
	TypeIQ4_NL:  {"IQ4_NL", 32, 2 + 16, true},
	TypeIQ3_S:   {"IQ3_S", QK_K, 2 + QK_K/4 + QK_K/32 + QK_K/8 + QK_K/64, true},
	TypeIQ2_S:   {"IQ2_S", QK_K, 2 + QK_K/4 + QK_K/32 + QK_K/32, true},
	TypeIQ4_XS:  {"IQ4_XS", QK_K, 2 + 2 + QK_K/64 + QK_K/2, true},
	TypeI8:      {"I8", 1, 1, false},
	TypeI16:     {"I16", 1, 2, false},
	TypeI32:     {"I32", 1, 4, false},
	TypeI64:     {"I64", 1, 8, false},
	TypeF64:     {"F64", 1, 8, false},
	TypeIQ1_M:   {"IQ1_M", QK_K, QK_K/8 + QK_K/16 + QK_K/32, true},
	TypeBF16:    {"BF16", 1, 2, false},
	TypeTQ1_0:   {"TQ1_0", QK_K, (QK_K-4*QK_K/64)/5 + QK_K/64 + 2, true},
	TypeTQ2_0:   {"TQ2_0", QK_K, QK_K/4 + 2, true},
	TypeMXFP4:   {"MXFP4", 32, 1 + 16, true},
}

// Info returns the packing of t, and false for an unknown id.
func (t Type) Info() (TypeInfo, bool) {
	ti, ok := typeTable[t]
	return ti, ok
}

// Known reports whether t is a type id that ggml defines today.
func (t Type) Known() bool { _, ok := typeTable[t]; return ok }

func (t Type) String() string {
	if ti, ok := typeTable[t]; ok {
		return ti.Name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// TypeByName finds a type by its ggml name ("Q4_K", case-sensitive).
func TypeByName(name string) (Type, bool) {
	for t, ti := range typeTable {
		if ti.Name == name {
			return t, true
		}
	}
	return 0, false
}

// Types lists every known type in id order.
func Types() []Type {
	out := make([]Type, 0, len(typeTable))
	for t := Type(0); t < 64; t++ {
		if _, ok := typeTable[t]; ok {
			out = append(out, t)
		}
	}
	return out
}

// RowBytes is the size of n consecutive elements of type t. n must be a
// multiple of the block size.
func (t Type) RowBytes(n uint64) (uint64, error) {
	ti, ok := typeTable[t]
	if !ok {
		return 0, fmt.Errorf("unknown ggml type id %d", uint32(t))
	}
	if n%uint64(ti.BlockSize) != 0 {
		return 0, fmt.Errorf("%d elements of %s: not a multiple of its block size %d", n, ti.Name, ti.BlockSize)
	}
	return n / uint64(ti.BlockSize) * uint64(ti.BlockBytes), nil
}
