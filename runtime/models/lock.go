package models

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
// then finds the model there.

// Waiter is implemented by a Progress that wants to know when a pull
// waits for another pull of the same model.
type Waiter interface {
	Waiting(name string)
}

// errLocked says another holder has the lock (tryLock).
var errLocked = errors.New("locked")

// lockPoll is how often a waiting pull tries the lock again.
const lockPoll = 200 * time.Millisecond

// lockPull takes the pull lock of the model folder dir, waiting while
// another pull holds it (progress hears of it once, if it is a Waiter)
// until ctx ends. unlock releases it.
func (s *Store) lockPull(ctx context.Context, dir, name string, progress Progress) (unlock func(), err error) {
	locks := filepath.Join(s.Dir, ".locks")
	if err := os.MkdirAll(locks, 0o755); err != nil {
		return nil, fmt.Errorf("models directory: %w", err)
	}
	p := s.lockPath(dir)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pull lock: %w", err)
	}
	told := false
	for {
		err := tryLock(f)
		if err == nil {
			return func() { unlockFile(f); f.Close() }, nil
		}
		if !errors.Is(err, errLocked) {
			f.Close()
			return nil, fmt.Errorf("pull lock %s: %w", p, err)
		}
		if w, ok := progress.(Waiter); ok && !told {
			w.Waiting(name)
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another pull of %s: %w", name, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// lockPath is the lock file of the model folder dir.
func (s *Store) lockPath(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return filepath.Join(s.Dir, ".locks", hex.EncodeToString(sum[:8])+".lock")
}

// lockForRemove takes the pull lock of dir without waiting: a model being
// pulled is not removed under the pull. done releases it and removes the
// lock file (and the .locks folder when it is empty). A pull that opened
// the file just before may still take the removed file's lock: a pull
// racing an rm of the same model is not kept apart from a third.
func (s *Store) lockForRemove(dir, name string) (done func(), err error) {
	p := s.lockPath(dir)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) { // no .locks folder: no pull ever ran
			return func() {}, nil
		}
		return nil, fmt.Errorf("pull lock: %w", err)
	}
	if err := tryLock(f); err != nil {
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, fmt.Errorf("%s is being pulled; remove it when the pull ends", name)
		}
		return nil, fmt.Errorf("pull lock %s: %w", p, err)
	}
	return func() {
		unlockFile(f)
		f.Close() // first: Windows removes no open file
		os.Remove(p)
		os.Remove(filepath.Dir(p)) // only when empty
	}, nil
}
