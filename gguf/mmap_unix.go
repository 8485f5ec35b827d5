//go:build unix

package gguf

import (
	"os"

	"golang.org/x/sys/unix"
)

func mmap(f *os.File, size int64) ([]byte, func() error, error) {
	if int64(int(size)) != size {
		return nil, nil, unix.EFBIG
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return unix.Munmap(b) }, nil
}

// releasePages drops b's pages (page-aligned, inside a read-only shared
// mapping) from the process: MADV_DONTNEED on a file mapping never loses
// data, the next read faults the file's pages back in.
func releasePages(b []byte) error { return unix.Madvise(b, unix.MADV_DONTNEED) }

// keepDescriptor: the descriptor of a mapped file stays open, for Changed.
const keepDescriptor = true
