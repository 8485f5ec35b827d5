package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Two pulls of one model at once (two terminals, or a pull beside a
// server's) would write the same .partial files. A pull therefore holds an
// exclusive lock for the model's folder while it runs, taken on a file
// under the store's .locks folder (not in the model's folder, which
// ats rm removes when it is empty); a second pull waits for the first and
// then finds the model there. The holder removes the lock file when it is
// done, so nothing is left behind: a waiter that then gets the lock of the
// removed file sees that the path no longer names it, and takes the lock
// again on the file there now.

// Waiter is implemented by a Progress that wants to know when a pull
// waits for another pull of the same model.
type Waiter interface {
	Waiting(name string)
}

// errLocked says another holder has the lock (tryLock).
var errLocked = errors.New("locked")

// lockPoll is how often a waiting pull tries the lock again.
const lockPoll = 200 * time.Millisecond

// lockPath is the lock file of the model folder dir.
func (s *Store) lockPath(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return filepath.Join(s.Dir, ".locks", hex.EncodeToString(sum[:8])+".lock")
}

// lockModel takes the lock of the model folder dir. When another holder
// has it, it fails at once unless wait is set; then it waits (progress
// hears of it once, if it is a Waiter) until ctx ends. unlock releases the
// lock and removes the file (and the .locks folder when it is empty).
func (s *Store) lockModel(ctx context.Context, dir, name string, wait bool, progress Progress) (unlock func(), err error) {
	p := s.lockPath(dir)
	told := false
	for tries := 0; ; tries++ {
		// The folder again each time: the last holder removes it when it
		// is left empty.
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("models directory: %w", err)
		}
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if errors.Is(err, os.ErrNotExist) && tries < 100 {
			continue // removed between the two
		}
		if err != nil {
			return nil, fmt.Errorf("model lock: %w", err)
		}
		err = tryLock(f)
		if err == nil {
			if held, _ := f.Stat(); held != nil {
				if now, err := os.Stat(p); err == nil && os.SameFile(held, now) {
					return func() { release(f, p) }, nil
				}
			}
			// The holder before removed this file: lock the one there now.
			unlockFile(f)
			f.Close()
			continue
		}
		f.Close()
		switch {
		case !errors.Is(err, errLocked):
			return nil, fmt.Errorf("model lock %s: %w", p, err)
		case !wait:
			return nil, fmt.Errorf("%s is being pulled; try again when the pull ends", name)
		}
		if w, ok := progress.(Waiter); ok && !told {
			w.Waiting(name)
			told = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for another pull of %s: %w", name, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// release removes the lock file p while f holds its lock (where the
// system allows: elsewhere just after), then releases it.
func release(f *os.File, p string) {
	removed := os.Remove(p) == nil
	unlockFile(f)
	f.Close()
	if !removed {
		os.Remove(p)
	}
	os.Remove(filepath.Dir(p)) // only when empty
}
