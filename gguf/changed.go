package gguf

import (
	"fmt"
	"os"
	"time"
)

// A mapped model file that changes on disk while it is in use changes the
// tensors under the process's feet, and one that is truncated makes every
// read past its new end a SIGBUS, which kills the process. Changed lets a
// long-running user (the server) notice before it reads: it looks at the
// file the mapping holds, through the descriptor kept open with it, so a
// file replaced by renaming a new one over it (a new inode) does not
// count, since the mapping still holds the old one.

// fileStamp is what Changed compares against.
type fileStamp struct {
	path string
	fd   *os.File // the mapped file's descriptor, where kept (keepDescriptor)
	size int64
	mod  time.Time
}

// ChangedError says a part's file was modified, or truncated, after Open.
type ChangedError struct {
	Path       string
	Size, Was  int64 // its size now and when opened
	Truncated  bool  // smaller than when mapped: reads past its end fault
	ModifiedAt time.Time
}

func (e *ChangedError) Error() string {
	if e.Truncated {
		return fmt.Sprintf("gguf: %s was truncated to %d bytes while in use (it had %d): the rest of its tensors are gone", e.Path, e.Size, e.Was)
	}
	return fmt.Sprintf("gguf: %s was modified while in use (at %s): its tensors may have changed", e.Path, e.ModifiedAt.Format(time.RFC3339))
}

// Changed reports the first part whose file was modified or truncated
// since Open (a *ChangedError), or nil. It costs a stat call per part. A
// file that was never mapped (read into memory) cannot hurt the process
// and is not checked.
func (f *File) Changed() error {
	for _, p := range f.Parts {
		if !p.Mapped || p.stamp.path == "" {
			continue
		}
		var st os.FileInfo
		var err error
		if p.stamp.fd != nil {
			st, err = p.stamp.fd.Stat()
		} else {
			st, err = os.Stat(p.stamp.path)
		}
		if err != nil {
			return fmt.Errorf("gguf: %s: %w", p.Path, err)
		}
		if st.Size() < p.stamp.size {
			return &ChangedError{Path: p.Path, Size: st.Size(), Was: p.stamp.size, Truncated: true, ModifiedAt: st.ModTime()}
		}
		if st.Size() != p.stamp.size || !st.ModTime().Equal(p.stamp.mod) {
			return &ChangedError{Path: p.Path, Size: st.Size(), Was: p.stamp.size, ModifiedAt: st.ModTime()}
		}
	}
	return nil
}
