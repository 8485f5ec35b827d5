package hub

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// diskFull makes writes fail with ENOSPC once limit bytes are in the
// file, after writing what fits, as a full disk does; then, while full,
// fails without writing, until grow is called (space freed).
type diskFull struct {
	mu    sync.Mutex
	limit int64
	full  int // failed writes so far
	grown bool
}

func (d *diskFull) writeAt(f *os.File, b []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.grown || off+int64(len(b)) <= d.limit {
		return f.WriteAt(b, off)
	}
	d.full++
	fit := max(d.limit-off, 0)
	n, err := f.WriteAt(b[:fit], off)
	if err != nil {
		return n, err
	}
	return n, &fs.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
}

func (d *diskFull) grow() { d.mu.Lock(); d.grown = true; d.mu.Unlock() }

// Issue 33: a short write on a full disk used to move the file's offset
// without counting, so the resumed bytes landed past where they belonged
// and a digest of the stream called the corrupt file verified. Now the
// bytes land where they belong, and the file on disk is what is checked.
func TestPullAfterDiskFull(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	disk := &diskFull{limit: 123_457}
	c.testWriteAt = disk.writeAt
	// The space comes back after the first failure, as when the tmpfs of
	// the report was grown.
	rec := &retryThen{then: disk.grow}
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	if disk.full == 0 || len(rec.retries) == 0 || !strings.Contains(rec.retries[0].Error(), "no space left") {
		t.Fatalf("the disk never filled: %d failed writes, retries %v", disk.full, rec.retries)
	}
	b, _ := os.ReadFile(res.Manifest.Path())
	want := repo.Files["Tiny-Q4_K_M.gguf"]
	if !bytes.Equal(b, want) {
		t.Fatalf("the file differs from the source: %d bytes, want %d", len(b), len(want))
	}
	if f := res.Manifest.Files[0]; !f.Verified || f.Size != int64(len(want)) {
		t.Errorf("manifest file %+v", f)
	}
}

// retryThen runs then at the first retry.
type retryThen struct {
	recorder
	then func()
	once sync.Once
}

func (r *retryThen) Retry(err error, d time.Duration) {
	r.recorder.Retry(err, d)
	r.once.Do(r.then)
}

// A disk that stays full: the pull gives up, and the partial file holds
// exactly what was counted (the next pull resumes it correctly).
func TestPullDiskStaysFull(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	disk := &diskFull{limit: 100_001}
	c.testWriteAt = disk.writeAt
	_, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("err %v, want the pull to give up", err)
	}
	parts, _ := st.Partial()
	for p, n := range parts {
		b, _ := os.ReadFile(p)
		if n != 100_001 || !bytes.Equal(b, repo.Files["Tiny-Q4_K_M.gguf"][:n]) {
			t.Errorf("%s: %d bytes, want the source's first 100001", p, n)
		}
	}
	disk.grow()
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(res.Manifest.Path()); !bytes.Equal(b, repo.Files["Tiny-Q4_K_M.gguf"]) {
		t.Error("the resumed file differs")
	}
}

// The digest is taken of the file on disk: bytes that reach the disk
// wrong (whatever the reason) fail the check.
func TestPullChecksTheBytesOnDisk(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	c.testWriteAt = func(f *os.File, b []byte, off int64) (int, error) {
		if off <= 1000 && 1000 < off+int64(len(b)) {
			bad := append([]byte(nil), b...)
			bad[1000-off] ^= 0xff
			return f.WriteAt(bad, off)
		}
		return f.WriteAt(b, off)
	}
	_, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{})
	var ce *ChecksumError
	if !errors.As(err, &ce) {
		t.Fatalf("err %v, want a ChecksumError", err)
	}
	if _, err := st.Find("tiny"); err == nil {
		t.Error("the corrupt model is found")
	}
}

// Issue 33: a pull of a file that is not there leaves no folder and no
// empty .partial behind, and nothing unfinished to list.
func TestPullMissingLeavesNothing(t *testing.T) {
	st, c, srv := newTest(t, testRepo())
	for _, ref := range []string{srv.URL + "/files/missing.gguf", "hf.co/Org/Tiny-GGUF:Q2_K"} {
		if _, err := st.Pull(context.Background(), c, mustRef(t, ref), PullOptions{}); err == nil {
			t.Fatalf("%s: pulled", ref)
		}
	}
	var left []string
	filepath.WalkDir(st.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != st.Dir {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if u, _ := st.Unfinished(); len(u) > 0 {
		t.Errorf("unfinished pulls: %+v", u[0])
	}
}

// An interrupted pull is listed by its model's name and removed by it;
// so are partial files an older ats left without a record.
func TestUnfinishedListedAndRemoved(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	srv.StallAfter, srv.Stalls = 50_000, 1
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := st.Pull(ctx, c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Progress: &cancelAfter{n: 1, cancel: cancel}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	legacy := filepath.Join(st.Dir, "old", "model")
	os.MkdirAll(legacy, 0o755)
	os.WriteFile(filepath.Join(legacy, "m.gguf"+partialSuffix), nil, 0o644)

	us, err := st.Unfinished()
	if err != nil || len(us) != 2 {
		t.Fatalf("Unfinished() = %v, %v", us, err)
	}
	if u := us[0]; u.Name != "hf.co/Org/Tiny-GGUF:Q4_K_M" || u.Bytes == 0 || len(u.Files) != 1 || u.Files[0] != "Tiny-Q4_K_M.gguf" || !strings.Contains(u.Source, "Tiny-GGUF") {
		t.Errorf("unfinished pull %+v", u)
	}
	if us[1].Name != "old/model" {
		t.Errorf("legacy partial listed as %q", us[1].Name)
	}
	if _, err := st.Remove("hf.co/Org/Tiny-GGUF:Q4_K_M"); err == nil {
		t.Error("Remove found an unfinished pull as a model")
	}
	for _, name := range []string{"HF.co/org/tiny-gguf:q4_k_m", "old/model"} {
		if _, err := st.RemoveUnfinished(name); err != nil {
			t.Errorf("RemoveUnfinished(%q): %v", name, err)
		}
	}
	var left []string
	filepath.WalkDir(st.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	// A finished pull leaves no record.
	if _, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q8_0"), PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if us, _ := st.Unfinished(); len(us) != 0 {
		t.Errorf("after a finished pull: %+v", us)
	}
	m, _ := st.Find("hf.co/Org/Tiny-GGUF:Q8_0")
	if _, err := os.Stat(filepath.Join(m.Dir(), PendingName)); !os.IsNotExist(err) {
		t.Errorf("the record outlived the pull: %v", err)
	}
}
