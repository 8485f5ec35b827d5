package hub

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/runtime/hub/hubtest"
)

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// testRepo is a repository with three quantizations, one split in two
// parts, and a README.
func testRepo() *hubtest.Repo {
	return &hubtest.Repo{
		ID: "Org/Tiny-GGUF",
		Files: map[string][]byte{
			"README.md":                              []byte("# Tiny\n"),
			"Tiny-Q4_K_M.gguf":                       randomBytes(1, 300_000),
			"Tiny-Q8_0.gguf":                         randomBytes(2, 200_000),
			"Q6_K/Tiny-Q6_K-00001-of-00002.gguf":     randomBytes(3, 150_000),
			"Q6_K/Tiny-Q6_K-00002-of-00002.gguf":     randomBytes(4, 120_000),
			"mmproj-Tiny-F16.gguf":                   randomBytes(5, 1000),
			"tokenizer_only-not-a-quant-at-all.json": []byte("{}"),
		},
		InGit: map[string]bool{"README.md": true},
	}
}

// recorder is a Progress that keeps what it heard.
type recorder struct {
	mu      sync.Mutex
	starts  []string
	haves   []int64
	added   int64
	retries []error
	done    []File
}

func (r *recorder) Start(name string, size, have int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, name)
	r.haves = append(r.haves, have)
}
func (r *recorder) Add(n int64) { r.mu.Lock(); r.added += n; r.mu.Unlock() }
func (r *recorder) Retry(err error, _ time.Duration) {
	r.mu.Lock()
	r.retries = append(r.retries, err)
	r.mu.Unlock()
}
func (r *recorder) Done(f File) { r.mu.Lock(); r.done = append(r.done, f); r.mu.Unlock() }

func newTest(t *testing.T, repos ...*hubtest.Repo) (*Store, *Client, *hubtest.Server) {
	t.Helper()
	srv := hubtest.New(repos...)
	t.Cleanup(srv.Close)
	c := &Client{Endpoint: srv.URL, RetryWait: time.Millisecond}
	return &Store{Dir: filepath.Join(t.TempDir(), "models")}, c, srv
}

func mustRef(t *testing.T, s string) Ref {
	t.Helper()
	r, err := ParseRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPullHub(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	rec := &recorder{}
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/org/tiny-gguf:q4_k_m"), PullOptions{Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	m := res.Manifest
	want := repo.Files["Tiny-Q4_K_M.gguf"]
	if m.Name != "hf.co/Org/Tiny-GGUF:Q4_K_M" || m.Quant != "Q4_K_M" || m.Revision != repo.SHA {
		t.Errorf("manifest %+v", m)
	}
	if diff := cmp.Diff([]string{"tiny:q4_k_m"}, m.Aliases); diff != "" {
		t.Errorf("aliases (-want +got):\n%s", diff)
	}
	got, err := os.ReadFile(m.Path())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("pulled file differs (%v)", err)
	}
	f := m.Files[0]
	if f.Size != int64(len(want)) || f.SHA256 != hubtest.SHA256(want) || !f.Verified {
		t.Errorf("file record %+v", f)
	}
	if rec.added != int64(len(want)) || len(rec.done) != 1 {
		t.Errorf("progress: %d bytes, %d done", rec.added, len(rec.done))
	}
	// The download went through the hub's redirect to the CDN, at the
	// listed commit.
	var paths []string
	for _, r := range srv.Requests() {
		paths = append(paths, r.Path)
	}
	wantPaths := []string{"/api/models/org/tiny-gguf", "/Org/Tiny-GGUF/resolve/" + repo.SHA + "/Tiny-Q4_K_M.gguf", "/cdn/" + hubtest.SHA256(want)}
	if diff := cmp.Diff(wantPaths, paths); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	// No .partial is left behind.
	if _, err := os.Stat(m.Path() + partialSuffix); !os.IsNotExist(err) {
		t.Errorf(".partial left: %v", err)
	}

	// Every name finds it.
	for _, name := range []string{"hf.co/Org/Tiny-GGUF:Q4_K_M", "HF.CO/org/tiny-gguf:q4_k_m", "huggingface.co/Org/Tiny-GGUF:Q4_K_M",
		"tiny:q4_k_m", "tiny", "hf.co/Org/Tiny-GGUF"} {
		got, err := st.Find(name)
		if err != nil || got.Path() != m.Path() {
			t.Errorf("Find(%q) = %v, %v", name, got, err)
		}
	}
	var nf *NotFoundError
	if _, err := st.Find("qwen3:8b"); !errors.As(err, &nf) {
		t.Errorf("Find of a missing name: %v", err)
	}

	// A second pull finds it complete and downloads nothing.
	before := len(srv.Requests())
	res, err = st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Aliases: []string{"tiny:latest"}})
	if err != nil || len(res.Fetched) != 0 {
		t.Fatalf("second pull: %v, fetched %v", err, res.Fetched)
	}
	if n := len(srv.Requests()) - before; n != 1 {
		t.Errorf("second pull made %d requests, want the listing only", n)
	}
	if m, err := st.Find("tiny:latest"); err != nil || m.Name != "hf.co/Org/Tiny-GGUF:Q4_K_M" {
		t.Errorf("alias added on the second pull: %v %v", m, err)
	}

	// A second quantization: "tiny" alone is now ambiguous.
	if _, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q8_0"), PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Find("tiny"); err == nil || !strings.Contains(err.Error(), "could be") {
		t.Errorf("ambiguous name: %v", err)
	}
	ms, errs := st.List()
	if len(errs) != 0 || len(ms) != 2 || ms[0].Name != "hf.co/Org/Tiny-GGUF:Q4_K_M" || ms[1].Name != "hf.co/Org/Tiny-GGUF:Q8_0" {
		t.Errorf("List: %v %v", ms, errs)
	}

	// rm deletes the files and the folders left empty, not the other model.
	if _, err := st.Remove("tiny:q8_0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.Dir, "hf.co", "Org", "Tiny-GGUF", "Q8_0")); !os.IsNotExist(err) {
		t.Errorf("folder of the removed model: %v", err)
	}
	if _, err := st.Find("tiny"); err != nil {
		t.Errorf("the other model after rm: %v", err)
	}
	if _, err := st.Remove("hf.co/Org/Tiny-GGUF:Q4_K_M"); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(st.Dir); err != nil || len(entries) != 0 {
		t.Errorf("models directory after removing everything: %v %v", entries, err)
	}
}

func TestPullSplit(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q6_K"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := res.Manifest
	if len(m.Files) != 2 || m.Files[0].Name != "Tiny-Q6_K-00001-of-00002.gguf" || filepath.Base(m.Path()) != m.Files[0].Name {
		t.Fatalf("files %+v", m.Files)
	}
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(m.Dir(), f.Name))
		if err != nil || !bytes.Equal(b, repo.Files["Q6_K/"+f.Name]) {
			t.Errorf("%s differs (%v)", f.Name, err)
		}
	}
}

// A transfer broken off midway resumes from where it stopped with a Range
// request, and the result is the whole file.
func TestPullResumesBrokenTransfer(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	srv.CutAfter, srv.Cuts = 100_000, 2
	rec := &recorder{}
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(res.Manifest.Path())
	if !bytes.Equal(b, repo.Files["Tiny-Q4_K_M.gguf"]) {
		t.Fatal("resumed file differs")
	}
	if len(rec.retries) != 2 {
		t.Errorf("%d retries, want 2: %v", len(rec.retries), rec.retries)
	}
	var ranges []string
	for _, r := range srv.Requests() {
		if strings.HasPrefix(r.Path, "/cdn/") {
			ranges = append(ranges, r.Range)
		}
	}
	if diff := cmp.Diff([]string{"", "bytes=100000-", "bytes=200000-"}, ranges); diff != "" {
		t.Errorf("Range headers at the CDN (-want +got):\n%s", diff)
	}
}

// A pull interrupted earlier (the .partial file it left) is resumed by
// the next one.
func TestPullResumesEarlierPull(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	content := repo.Files["Tiny-Q4_K_M.gguf"]
	dir := filepath.Join(st.Dir, "hf.co", "Org", "Tiny-GGUF", "Q4_K_M")
	os.MkdirAll(dir, 0o755)
	partial := filepath.Join(dir, "Tiny-Q4_K_M.gguf"+partialSuffix)
	if err := os.WriteFile(partial, content[:123_456], 0o644); err != nil {
		t.Fatal(err)
	}
	parts, err := st.Partial()
	if err != nil || parts[partial] != 123_456 {
		t.Errorf("Partial() = %v, %v", parts, err)
	}
	if _, err := st.Find("tiny"); err == nil {
		t.Error("an unfinished pull is found as a model")
	}
	rec := &recorder{}
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(res.Manifest.Path())
	if !bytes.Equal(b, content) || !res.Manifest.Files[0].Verified {
		t.Fatal("resumed file differs or is unverified")
	}
	if rec.haves[0] != 123_456 || rec.added != int64(len(content)-123_456) {
		t.Errorf("progress: had %d, added %d", rec.haves[0], rec.added)
	}
	last := srv.Requests()[len(srv.Requests())-1]
	if last.Range != "bytes=123456-" {
		t.Errorf("last request %+v, want a Range from 123456", last)
	}
}

// A transfer that stops sending is broken off after Client.Stall and
// resumed.
func TestPullResumesStalledTransfer(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	c.Stall = 100 * time.Millisecond
	srv.StallAfter, srv.Stalls = 64_000, 1
	rec := &recorder{}
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q8_0"), PullOptions{Progress: rec})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(res.Manifest.Path())
	if !bytes.Equal(b, repo.Files["Tiny-Q8_0.gguf"]) {
		t.Fatal("file differs")
	}
	if len(rec.retries) != 1 || !strings.Contains(rec.retries[0].Error(), "no data for too long") {
		t.Errorf("retries %v", rec.retries)
	}
}

// A server that ignores Range sends the whole file again: the partial file
// is replaced, not appended to.
func TestPullServerIgnoresRange(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	srv.IgnoreRange = true
	srv.CutAfter, srv.Cuts = 50_000, 1
	res, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q8_0"), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(res.Manifest.Path())
	if !bytes.Equal(b, repo.Files["Tiny-Q8_0.gguf"]) {
		t.Fatal("file differs")
	}
}

// A download whose sha256 is not the hub's is deleted, and nothing is
// placed.
func TestPullRejectsWrongChecksum(t *testing.T) {
	repo := testRepo()
	repo.WrongSHA = map[string]bool{"Tiny-Q4_K_M.gguf": true}
	st, c, _ := newTest(t, repo)
	_, err := st.Pull(context.Background(), c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{})
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Got != hubtest.SHA256(repo.Files["Tiny-Q4_K_M.gguf"]) {
		t.Fatalf("err %v, want a ChecksumError", err)
	}
	dir := filepath.Join(st.Dir, "hf.co", "Org", "Tiny-GGUF", "Q4_K_M")
	for _, f := range []string{"Tiny-Q4_K_M.gguf", "Tiny-Q4_K_M.gguf" + partialSuffix, ManifestName} {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed check: %v", f, err)
		}
	}
	if _, err := st.Find("tiny"); err == nil {
		t.Error("a model that failed its check is found")
	}
}

// A .partial that does not belong to the file (another version, garbage)
// fails the check and is deleted, so the next pull starts afresh.
func TestPullCorruptPartial(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	dir := filepath.Join(st.Dir, "hf.co", "Org", "Tiny-GGUF", "Q4_K_M")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "Tiny-Q4_K_M.gguf"+partialSuffix), randomBytes(99, 1000), 0o644)
	ref := mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M")
	var ce *ChecksumError
	if _, err := st.Pull(context.Background(), c, ref, PullOptions{}); !errors.As(err, &ce) {
		t.Fatalf("err %v, want a ChecksumError", err)
	}
	if _, err := st.Pull(context.Background(), c, ref, PullOptions{}); err != nil {
		t.Fatalf("pull after the corrupt partial was removed: %v", err)
	}
}

// A hub file's download URL, pulled as a plain URL, is checked against
// the sha256 the hub sends with its redirect (X-Linked-Etag).
func TestPullHubFileURL(t *testing.T) {
	repo := testRepo()
	repo.WrongSHA = map[string]bool{"Tiny-Q4_K_M.gguf": true}
	st, c, srv := newTest(t, repo)
	res, err := st.Pull(context.Background(), c, mustRef(t, srv.URL+"/Org/Tiny-GGUF/resolve/main/Tiny-Q8_0.gguf"), PullOptions{})
	if err != nil || !res.Manifest.Files[0].Verified || res.Manifest.Name != "Tiny-Q8_0" {
		t.Fatalf("%v %+v", err, res)
	}
	var ce *ChecksumError
	if _, err := st.Pull(context.Background(), c, mustRef(t, srv.URL+"/Org/Tiny-GGUF/resolve/main/Tiny-Q4_K_M.gguf"), PullOptions{}); !errors.As(err, &ce) {
		t.Errorf("wrong X-Linked-Etag: %v", err)
	}
}

func TestPullURL(t *testing.T) {
	st, c, srv := newTest(t)
	content := randomBytes(7, 70_000)
	u := srv.AddFile("My-Model-Q8_0.gguf", content)
	res, err := st.Pull(context.Background(), c, mustRef(t, u), PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := res.Manifest
	if m.Name != "My-Model-Q8_0" || m.Source != u || m.Files[0].Verified || m.Files[0].SHA256 != hubtest.SHA256(content) {
		t.Errorf("manifest %+v %+v", m, m.Files)
	}
	// With the digest given it is checked.
	u2 := srv.AddFile("other.gguf", content)
	if _, err := st.Pull(context.Background(), c, mustRef(t, u2), PullOptions{Name: "other", SHA256: strings.Repeat("ab", 32)}); err == nil ||
		!strings.Contains(err.Error(), "corrupt") {
		t.Errorf("wrong --sha256: %v", err)
	}
	res, err = st.Pull(context.Background(), c, mustRef(t, u2), PullOptions{Name: "other:v1", SHA256: strings.ToUpper(hubtest.SHA256(content))})
	if err != nil || !res.Manifest.Files[0].Verified {
		t.Errorf("right --sha256: %v", err)
	}
	// The name of another model is refused.
	if _, err := st.Pull(context.Background(), c, mustRef(t, u2), PullOptions{Name: "x", Aliases: []string{"my-model-q8_0"}}); err == nil ||
		!strings.Contains(err.Error(), "is taken") {
		t.Errorf("taken alias: %v", err)
	}
	// Split URLs: the first part brings the others.
	p1, p2 := randomBytes(8, 1000), randomBytes(9, 2000)
	first := srv.AddFile("Big-00001-of-00002.gguf", p1)
	srv.AddFile("Big-00002-of-00002.gguf", p2)
	res, err = st.Pull(context.Background(), c, mustRef(t, first), PullOptions{})
	if err != nil || len(res.Manifest.Files) != 2 || res.Manifest.Name != "Big" {
		t.Fatalf("split URL: %v %+v", err, res)
	}
	second := strings.Replace(first, "00001-of", "00002-of", 1)
	if _, err := st.Pull(context.Background(), c, mustRef(t, second), PullOptions{}); err == nil || !strings.Contains(err.Error(), "pull the first part") {
		t.Errorf("second part's URL: %v", err)
	}
}

func TestPullErrors(t *testing.T) {
	repo := testRepo()
	repo.ID = "Org/Gated-GGUF"
	repo.Token = "secret"
	st, c, srv := newTest(t, testRepo(), repo)
	ctx := context.Background()
	for _, tc := range []struct{ ref, want string }{
		{"hf.co/Org/Nothing-GGUF:Q4_K_M", "no repository Org/Nothing-GGUF"},
		{"hf.co/Org/Tiny-GGUF:Q2_K", "no Q2_K file; it has Q4_K_M, Q6_K, Q8_0"},
		{"hf.co/Org/Gated-GGUF:Q4_K_M", "HF_TOKEN"},
		{srv.URL + "/files/missing.gguf", "404"},
	} {
		_, err := st.Pull(ctx, c, mustRef(t, tc.ref), PullOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to mention %q", tc.ref, err, tc.want)
		}
	}
	// With the token it downloads; the token goes to the hub, not to the
	// CDN on another host the hub redirects to.
	cdn := hubtest.New(repo)
	defer cdn.Close()
	srv.CDN = cdn.URL
	c.Token = "secret"
	if _, err := st.Pull(ctx, c, mustRef(t, "hf.co/Org/Gated-GGUF:Q4_K_M"), PullOptions{}); err != nil {
		t.Errorf("gated with the token: %v", err)
	}
	var hubAuth bool
	for _, r := range srv.Requests() {
		hubAuth = hubAuth || strings.Contains(r.Path, "/resolve/") && r.Auth == "Bearer secret"
	}
	cdnReqs := cdn.Requests()
	if !hubAuth || len(cdnReqs) == 0 {
		t.Errorf("hub requests with the token: %v; CDN requests: %v", hubAuth, cdnReqs)
	}
	for _, r := range cdnReqs {
		if r.Auth != "" {
			t.Errorf("the token went to the CDN: %+v", r)
		}
	}
}

// Offline: the error says which host could not be reached.
func TestPullUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	st := &Store{Dir: t.TempDir()}
	c := &Client{Endpoint: "http://" + addr, RetryWait: time.Millisecond}
	for _, ref := range []string{"hf.co/Org/Tiny-GGUF:Q4_K_M", "http://" + addr + "/m.gguf"} {
		_, err = st.Pull(context.Background(), c, mustRef(t, ref), PullOptions{})
		var ue *UnreachableError
		if !errors.As(err, &ue) || ue.Host != addr || !strings.Contains(err.Error(), "cannot reach "+addr) {
			t.Errorf("%s: %v, want an UnreachableError for %s", ref, err, addr)
		}
		t.Log(err)
	}
}

// Cancelling a pull keeps what arrived for the next one.
func TestPullCancelKeepsPartial(t *testing.T) {
	repo := testRepo()
	st, c, srv := newTest(t, repo)
	// The server holds the transfer after 50 kB: the cancel below comes
	// while it waits, as a Ctrl-C would.
	srv.StallAfter, srv.Stalls = 50_000, 1
	ctx, cancel := context.WithCancel(context.Background())
	p := &cancelAfter{n: 1, cancel: cancel}
	_, err := st.Pull(ctx, c, mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M"), PullOptions{Progress: p})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "pull again to resume") {
		t.Fatalf("err %v", err)
	}
	parts, _ := st.Partial()
	if len(parts) != 1 {
		t.Fatalf("partial files %v", parts)
	}
	for _, n := range parts {
		if n == 0 {
			t.Error("nothing kept")
		}
	}
}

type cancelAfter struct {
	recorder
	n      int
	cancel func()
}

func (c *cancelAfter) Add(n int64) {
	c.recorder.Add(n)
	if c.n--; c.n == 0 {
		c.cancel()
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv("ATS_MODELS", "/x/models")
	if d, _ := DefaultDir(); d != "/x/models" {
		t.Errorf("ATS_MODELS: %q", d)
	}
	t.Setenv("ATS_MODELS", "")
	t.Setenv("XDG_DATA_HOME", "/data")
	t.Setenv("HOME", "/home/u")
	d, err := DefaultDir()
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case strings.HasPrefix(d, "/data"):
		if d != filepath.Join("/data", "ats", "models") {
			t.Errorf("XDG_DATA_HOME: %q", d)
		}
	default:
		t.Logf("default models directory here: %s", d)
	}
}

// waitRecorder is a recorder that also hears when a pull waits.
type waitRecorder struct {
	recorder
	waited chan string
}

func (w *waitRecorder) Waiting(name string) { w.waited <- name }

// A pull of a model another pull holds waits for it, then finds the model
// there; a cancel while waiting ends it.
func TestPullWaitsForAnotherPull(t *testing.T) {
	repo := testRepo()
	st, c, _ := newTest(t, repo)
	ref := mustRef(t, "hf.co/Org/Tiny-GGUF:Q4_K_M")
	first, err := st.Pull(context.Background(), c, ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Hold the model's lock as a running pull would.
	unlock, err := st.lockModel(context.Background(), first.Manifest.dir, first.Manifest.Name, true, noProgress{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &waitRecorder{waited: make(chan string, 1)}
	done := make(chan error, 1)
	var res *PullResult
	go func() {
		var err error
		res, err = st.Pull(context.Background(), c, ref, PullOptions{Progress: rec})
		done <- err
	}()
	select {
	case name := <-rec.waited:
		if name != first.Manifest.Name {
			t.Errorf("waiting for %q, want %q", name, first.Manifest.Name)
		}
	case err := <-done:
		t.Fatalf("the pull did not wait for the lock (err %v)", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the pull neither waited nor finished")
	}
	select {
	case err := <-done:
		t.Fatalf("the pull finished while the lock was held (err %v)", err)
	case <-time.After(3 * lockPoll):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(res.Fetched) != 0 {
		t.Errorf("fetched %d files again after waiting", len(res.Fetched))
	}

	// Cancelled while waiting; and no rm under a running pull.
	unlock, err = st.lockModel(context.Background(), first.Manifest.dir, first.Manifest.Name, true, noProgress{})
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := st.Remove(first.Manifest.Name); err == nil || !strings.Contains(err.Error(), "being pulled") {
		t.Errorf("rm during a pull: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel()
	if _, err := st.Pull(ctx, c, ref, PullOptions{}); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another pull") {
		t.Fatalf("err %v", err)
	}
	// The lock file, under .locks, is not taken for a model.
	if ms, errs := st.List(); len(errs) != 0 || len(ms) != 1 {
		t.Errorf("list: %d models, errors %v", len(ms), errs)
	}
}
