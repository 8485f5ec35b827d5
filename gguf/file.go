package gguf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"unsafe"
)

// KV is one metadata entry, in file order.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo is a tensor as its header describes it.
type TensorInfo struct {
	Name   string
	Dims   []uint64 // ggml order: Dims[0] is the row length (ne0)
	Type   Type
	Offset uint64 // from the start of its file's data section
	Size   uint64 // bytes
}

// Elements is the number of values in the tensor.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Rows is the number of rows of length Dims[0] (0 for an empty tensor).
func (t *TensorInfo) Rows() uint64 {
	if len(t.Dims) == 0 || t.Dims[0] == 0 {
		return 0
	}
	return t.Elements() / t.Dims[0]
}

// Tensor is a tensor with its bytes: a view into the mapped file, never a copy.
type Tensor struct {
	TensorInfo
	Data []byte
	Part int // which file of a split model holds it (0 for single files)
}

// Part is one file of a model.
type Part struct {
	Path       string
	Version    uint32
	KVs        []KV
	Tensors    []TensorInfo // header order
	Alignment  uint64
	DataOffset int64  // where the data section starts
	Data       []byte // the whole file (mapped)
	Mapped     bool   // Data is an mmap, not a heap copy
	Tail       []byte // padding after the last tensor (or the header), kept for exact round trips
	unmap      func() error
	stamp      fileStamp // the file when opened (changed.go)
}

// File is an opened model: one GGUF file, or every part of a split model
// presented as one.
type File struct {
	Path    string
	Parts   []*Part
	KVs     []KV // of the first part, in file order
	Tensors []*Tensor
	kv      map[string]int
	byName  map[string]*Tensor
	Mapped  bool // tensor data is an mmap, not a heap copy
}

var splitName = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// Open opens a GGUF file. When path names the first part of a split model
// (name-00001-of-00003.gguf) every part is opened and presented as one
// model. Tensor data stays in the mapped file.
func Open(path string) (*File, error) {
	first, err := openPart(path)
	if err != nil {
		return nil, err
	}
	f := &File{Path: path, Parts: []*Part{first}, KVs: first.KVs, Mapped: true}
	f.index()
	count := 1
	if v, ok := f.Get(KeySplitCount); ok {
		n, ok := v.asUint()
		if !ok || n == 0 || n > 99999 {
			f.Close()
			return nil, fmt.Errorf("gguf: %s: %s is %v, want 1 to 99999", path, KeySplitCount, v)
		}
		count = int(n)
		if no, ok := f.Get(KeySplitNo); ok {
			x, ok := no.asUint()
			if !ok || x >= uint64(count) {
				f.Close()
				return nil, fmt.Errorf("gguf: %s: %s is %v, want 0 to %d", path, KeySplitNo, no, count-1)
			}
			if x != 0 {
				f.Close()
				first := "the first part"
				if m := splitName.FindStringSubmatch(filepath.Base(path)); m != nil {
					first = SplitPath(filepath.Join(filepath.Dir(path), m[1]), 1, count)
				}
				return nil, fmt.Errorf("gguf: %s is part %d of %d of a split model (%s=%d): open %s instead", path, x+1, count, KeySplitNo, x, first)
			}
		}
	}
	if count > 1 {
		m := splitName.FindStringSubmatch(filepath.Base(path))
		if m == nil {
			f.Close()
			return nil, fmt.Errorf("gguf: %s: split.count is %d but the name does not follow NAME-00001-of-%05d.gguf", path, count, count)
		}
		if n, _ := strconv.Atoi(m[3]); n != count {
			f.Close()
			return nil, fmt.Errorf("gguf: %s: the name says %d parts, split.count says %d", path, n, count)
		}
		for i := 2; i <= count; i++ {
			p := SplitPath(filepath.Join(filepath.Dir(path), m[1]), i, count)
			part, err := openPart(p)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("gguf: %s: part %d of %d: %w", path, i, count, err)
			}
			f.Parts = append(f.Parts, part)
			// A part from another split of the same name (re-split with a
			// different count, or copied over) must not be mixed in.
			if err := checkPart(part, i, count); err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	for pi, p := range f.Parts {
		if !p.Mapped {
			f.Mapped = false
		}
		for _, ti := range p.Tensors {
			if _, dup := f.byName[ti.Name]; dup {
				f.Close()
				return nil, fmt.Errorf("gguf: %s: tensor %q appears in more than one part", p.Path, ti.Name)
			}
			start := p.DataOffset + int64(ti.Offset)
			t := &Tensor{TensorInfo: ti, Data: p.Data[start : start+int64(ti.Size) : start+int64(ti.Size)], Part: pi}
			f.Tensors = append(f.Tensors, t)
			f.byName[ti.Name] = t
		}
	}
	if count > 1 {
		if v, ok := f.Get("split.tensors.count"); ok {
			if n, _ := v.asUint(); n != uint64(len(f.Tensors)) {
				f.Close()
				return nil, fmt.Errorf("gguf: %s: split.tensors.count says %d tensors, the %d parts hold %d", path, n, count, len(f.Tensors))
			}
		}
	}
	return f, nil
}

// checkPart verifies the split keys of part i (1-based) of count.
func checkPart(p *Part, i, count int) error {
	var no, n Value
	var hasNo, hasN bool
	for _, kv := range p.KVs {
		switch kv.Key {
		case KeySplitNo:
			no, hasNo = kv.Value, true
		case KeySplitCount:
			n, hasN = kv.Value, true
		}
	}
	if !hasNo || !hasN {
		return fmt.Errorf("gguf: %s: part %d of %d has no %s/%s keys: not part of a split model", p.Path, i, count, KeySplitNo, KeySplitCount)
	}
	if x, ok := no.asUint(); !ok || x != uint64(i-1) {
		return fmt.Errorf("gguf: %s: %s is %v, want %d for part %d of %d", p.Path, KeySplitNo, no, i-1, i, count)
	}
	if x, ok := n.asUint(); !ok || x != uint64(count) {
		return fmt.Errorf("gguf: %s: %s is %v, but the first part says %d", p.Path, KeySplitCount, n, count)
	}
	return nil
}

func openPart(path string) (*Part, error) {
	data, unmap, mapped, stamp, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	h, err := parse(path, data)
	if err != nil {
		unmap()
		return nil, err
	}
	return &Part{Path: path, Version: h.version, KVs: h.kvs, Tensors: h.tensors, Alignment: h.alignment,
		DataOffset: h.dataOffset, Data: data, Mapped: mapped, Tail: h.tail, unmap: unmap, stamp: stamp}, nil
}

// Parse reads a GGUF image that is already in memory. The File's tensor
// data aliases b.
func Parse(name string, b []byte) (*File, error) {
	h, err := parse(name, b)
	if err != nil {
		return nil, err
	}
	p := &Part{Path: name, Version: h.version, KVs: h.kvs, Tensors: h.tensors, Alignment: h.alignment, DataOffset: h.dataOffset, Data: b, Tail: h.tail}
	f := &File{Path: name, Parts: []*Part{p}, KVs: h.kvs}
	f.index()
	for _, ti := range h.tensors {
		start := h.dataOffset + int64(ti.Offset)
		t := &Tensor{TensorInfo: ti, Data: b[start : start+int64(ti.Size) : start+int64(ti.Size)]}
		f.Tensors = append(f.Tensors, t)
		f.byName[ti.Name] = t
	}
	return f, nil
}

func (f *File) index() {
	f.kv = make(map[string]int, len(f.KVs))
	for i, kv := range f.KVs {
		f.kv[kv.Key] = i
	}
	f.byName = make(map[string]*Tensor)
}

// Close unmaps every part. Tensor data must not be used afterwards.
func (f *File) Close() error {
	var errs []error
	for _, p := range f.Parts {
		if p.unmap != nil {
			errs = append(errs, p.unmap())
			p.unmap = nil
		}
	}
	return errors.Join(errs...)
}

// Tensor finds a tensor by name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	t, ok := f.byName[name]
	return t, ok
}

// Version is the GGUF version of the first part.
func (f *File) Version() uint32 { return f.Parts[0].Version }

// Alignment is the data alignment of the first part.
func (f *File) Alignment() uint64 { return f.Parts[0].Alignment }

// Size is the total size of all parts in bytes.
func (f *File) Size() int64 {
	var n int64
	for _, p := range f.Parts {
		n += int64(len(p.Data))
	}
	return n
}

// mapFile maps path read-only, or reads it where mapping is unavailable.
// stamp records the file as it was, for File.Changed.
func mapFile(path string) (b []byte, unmap func() error, mapped bool, stamp fileStamp, err error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, false, stamp, err
	}
	keep := false // the descriptor stays open with the mapping (Changed reads it)
	defer func() {
		if !keep {
			fd.Close()
		}
	}()
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, false, stamp, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, false, stamp, fmt.Errorf("%s: not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		return nil, nil, false, stamp, &ParseError{File: path, Offset: 0, Field: "magic", Msg: "empty file"}
	}
	stamp = fileStamp{path: path, size: size, mod: st.ModTime()}
	if b, unmap, err := mmap(fd, size); err == nil {
		if keepDescriptor {
			keep, stamp.fd = true, fd
			return b, func() error { return errors.Join(unmap(), fd.Close()) }, true, stamp, nil
		}
		return b, unmap, true, stamp, nil
	}
	b = make([]byte, size)
	if _, err := fd.ReadAt(b, 0); err != nil {
		return nil, nil, false, stamp, fmt.Errorf("%s: %w", path, err)
	}
	return b, func() error { return nil }, false, stamp, nil
}

// ReleasePages tells the operating system that the process no longer
// needs the mapped pages that lie wholly inside b, a slice of one of the
// file's parts (a tensor's data, say, once the GPU holds its own copy):
// they leave the process's resident memory, and a later read maps them
// again from the page cache or the disk, so the contents never change.
// It does nothing where b is not inside a mapped part, on platforms
// without madvise, and to the pages b shares with its neighbours. It
// returns the bytes released.
func (f *File) ReleasePages(b []byte) int64 {
	if len(b) == 0 {
		return 0
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	for _, p := range f.Parts {
		if !p.Mapped || len(p.Data) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(&p.Data[0]))
		if lo < base || lo+uintptr(len(b)) > base+uintptr(len(p.Data)) {
			continue
		}
		page := uintptr(os.Getpagesize())
		start := (lo + page - 1) &^ (page - 1)
		end := (lo + uintptr(len(b))) &^ (page - 1)
		if end <= start {
			return 0
		}
		if err := releasePages(p.Data[start-base : end-base]); err != nil {
			return 0
		}
		return int64(end - start)
	}
	return 0
}
