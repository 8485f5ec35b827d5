//go:build !unix && !windows

package gguf

import (
	"errors"
	"os"
)

func mmap(*os.File, int64) ([]byte, func() error, error) {
	return nil, nil, errors.New("mmap is not available on this platform")
}

func releasePages([]byte) error { return errors.ErrUnsupported }

// keepDescriptor: nothing is mapped here.
const keepDescriptor = false
