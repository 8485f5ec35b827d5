package gguf

import (
	"fmt"
	"math"
)

// ValueType is the type tag of a GGUF metadata value.
type ValueType uint32

const (
	ValUint8   ValueType = 0
	ValInt8    ValueType = 1
	ValUint16  ValueType = 2
	ValInt16   ValueType = 3
	ValUint32  ValueType = 4
	ValInt32   ValueType = 5
	ValFloat32 ValueType = 6
	ValBool    ValueType = 7
	ValString  ValueType = 8
	ValArray   ValueType = 9
	ValUint64  ValueType = 10
	ValInt64   ValueType = 11
	ValFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(t))
}

// scalarSize is the encoded size of a fixed-size scalar, 0 for string and array.
func (t ValueType) scalarSize() int {
	switch t {
	case ValUint8, ValInt8, ValBool:
		return 1
	case ValUint16, ValInt16:
		return 2
	case ValUint32, ValInt32, ValFloat32:
		return 4
	case ValUint64, ValInt64, ValFloat64:
		return 8
	}
	return 0
}

func (t ValueType) valid() bool { return t <= ValFloat64 }

// Value is one metadata value. Scalars hold the Go type of their tag
// (uint8 ... float64, bool, string). Arrays hold a typed slice
// ([]uint8 ... []float64, []bool, []string) or, for arrays of arrays, []Value.
type Value struct {
	Type ValueType // scalar type, or ValArray
	Elem ValueType // element type when Type is ValArray
	v    any
}

// Data returns the Go value: a scalar or a typed slice (see Value).
func (v Value) Data() any { return v.v }

// Len is the number of elements of an array value, 0 for a scalar.
func (v Value) Len() int {
	if v.Type != ValArray {
		return 0
	}
	switch a := v.v.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

// Constructors for writers.
func Uint8(x uint8) Value     { return Value{Type: ValUint8, v: x} }
func Int8(x int8) Value       { return Value{Type: ValInt8, v: x} }
func Uint16(x uint16) Value   { return Value{Type: ValUint16, v: x} }
func Int16(x int16) Value     { return Value{Type: ValInt16, v: x} }
func Uint32(x uint32) Value   { return Value{Type: ValUint32, v: x} }
func Int32(x int32) Value     { return Value{Type: ValInt32, v: x} }
func Float32(x float32) Value { return Value{Type: ValFloat32, v: x} }
func Bool(x bool) Value       { return Value{Type: ValBool, v: x} }
func String(x string) Value   { return Value{Type: ValString, v: x} }
func Uint64(x uint64) Value   { return Value{Type: ValUint64, v: x} }
func Int64(x int64) Value     { return Value{Type: ValInt64, v: x} }
func Float64(x float64) Value { return Value{Type: ValFloat64, v: x} }

// Array makes an array value from a typed slice ([]uint8 ... []string) or
// from []Value holding arrays (an array of arrays).
func Array(slice any) (Value, error) {
	var et ValueType
	switch a := slice.(type) {
	case []uint8:
		et = ValUint8
	case []int8:
		et = ValInt8
	case []uint16:
		et = ValUint16
	case []int16:
		et = ValInt16
	case []uint32:
		et = ValUint32
	case []int32:
		et = ValInt32
	case []float32:
		et = ValFloat32
	case []bool:
		et = ValBool
	case []string:
		et = ValString
	case []uint64:
		et = ValUint64
	case []int64:
		et = ValInt64
	case []float64:
		et = ValFloat64
	case []Value:
		for i, e := range a {
			if e.Type != ValArray {
				return Value{}, fmt.Errorf("gguf: array of arrays: element %d is a %s", i, e.Type)
			}
		}
		et = ValArray
	default:
		return Value{}, fmt.Errorf("gguf: cannot make an array of %T", slice)
	}
	return Value{Type: ValArray, Elem: et, v: slice}, nil
}

// MustArray is Array for slices known to be valid.
func MustArray(slice any) Value {
	v, err := Array(slice)
	if err != nil {
		panic(err)
	}
	return v
}

// asUint converts any integer scalar to uint64, failing on negatives.
func (v Value) asUint() (uint64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

func (v Value) asInt() (int64, bool) {
	switch x := v.v.(type) {
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

func (v Value) asFloat() (float64, bool) {
	switch x := v.v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := v.asInt(); ok {
		return float64(i), true
	}
	return 0, false
}

// String formats a value for people; long arrays are summarised.
func (v Value) String() string {
	if v.Type == ValArray {
		return fmt.Sprintf("[%s × %d]", v.Elem, v.Len())
	}
	return fmt.Sprint(v.v)
}
