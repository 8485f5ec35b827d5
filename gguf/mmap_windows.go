//go:build windows

package gguf

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/windows"
)

func mmap(f *os.File, size int64) ([]byte, func() error, error) {
	h, err := windows.CreateFileMapping(windows.Handle(f.Fd()), nil, windows.PAGE_READONLY, uint32(size>>32), uint32(size), nil)
	if err != nil {
		return nil, nil, err
	}
	addr, err := windows.MapViewOfFile(h, windows.FILE_MAP_READ, 0, 0, uintptr(size))
	if err != nil {
		windows.CloseHandle(h)
		return nil, nil, err
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(addr)), size)
	return b, func() error {
		err := windows.UnmapViewOfFile(addr)
		windows.CloseHandle(h)
		return err
	}, nil
}

// releasePages leaves the pages be (Windows trims a read-only view's
// working set itself under memory pressure) and says so.
func releasePages([]byte) error { return errors.ErrUnsupported }

// keepDescriptor: Windows does not let a mapped file be truncated, and an
// open descriptor would keep it from being renamed; Changed stats the path.
const keepDescriptor = false
