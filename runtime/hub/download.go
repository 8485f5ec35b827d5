package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// partialSuffix marks a file being downloaded; a later pull resumes it.
const partialSuffix = ".partial"

// Progress hears how a pull goes. Calls come from one goroutine.
type Progress interface {
	// Start: a file begins; size is -1 when unknown, have the bytes
	// already there from an earlier, interrupted pull.
	Start(name string, size, have int64)
	// Add: n more bytes arrived.
	Add(n int64)
	// Retry: the transfer broke (err) and resumes after wait.
	Retry(err error, wait time.Duration)
	// Done: the file is complete and verified.
	Done(f File)
}

type noProgress struct{}

func (noProgress) Start(string, int64, int64) {}
func (noProgress) Add(int64)                  {}
func (noProgress) Retry(error, time.Duration) {}
func (noProgress) Done(File)                  {}

// ChecksumError says a downloaded file is not what its source published.
type ChecksumError struct {
	File      string
	Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s: sha256 %s, but the source says %s: the download is corrupt and was deleted", e.File, e.Got, e.Want)
}

// fetchSpec is one file to download.
type fetchSpec struct {
	url    string
	dest   string // where the complete, verified file goes
	size   int64  // expected size; -1 unknown
	sha256 string // expected hex digest; "" unknown
	// created, when set, runs once the partial file has been made (the
	// pull records itself as unfinished then).
	created func() error
}

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// linkedDigest reads the sha256 the hub sends for an LFS file in
// X-Linked-Etag ("\"<hex>\"", possibly weak: W/"<hex>").
func linkedDigest(h http.Header) string {
	v := strings.ToLower(strings.Trim(strings.TrimPrefix(h.Get("X-Linked-Etag"), "W/"), `"`))
	if sha256Hex.MatchString(v) {
		return v
	}
	return ""
}

// Verifier is implemented by a Progress that wants to know when a file's
// bytes are read back from the disk to check their sha256 (seconds for a
// large model).
type Verifier interface {
	Verifying(name string, size int64)
}

// download is the state of one file's transfer.
//
// Bytes go into the partial file at explicit offsets, and have counts
// only those written: a write that fails part way (a full disk) leaves
// have at the end of what is there, the file is cut back to it, and the
// next request resumes from exactly there. Issue 33 found the old way (an
// appending write whose short count was dropped) put the retried bytes at
// the wrong offset, and a digest of the stream then called the corrupt
// file verified: the digest is now taken of the file on disk.
type download struct {
	c      *Client
	spec   fetchSpec
	f      *os.File // nil until the first byte is to be written
	have   int64
	total  int64  // -1 until known
	linked string // X-Linked-Etag
	p      Progress
}

// fetch downloads spec.url to spec.dest: into dest.partial, resuming what
// an earlier pull left there with a Range request, retrying broken
// transfers, then checks the size and the sha256 of the file on disk (the
// expected one, else the one the hub sends with the file) and renames the
// file into place. A file that fails the check is deleted. The partial
// file (and its folder) is made only once the source answers with data:
// a missing file leaves nothing behind.
func (c *Client) fetch(ctx context.Context, spec fetchSpec, p Progress) (File, error) {
	name := filepath.Base(spec.dest)
	partial := spec.dest + partialSuffix
	d := &download{c: c, spec: spec, total: spec.size, p: p}
	defer func() {
		if d.f != nil {
			d.f.Close()
		}
	}()
	if f, err := os.OpenFile(partial, os.O_RDWR, 0); err == nil {
		d.f = f
		st, err := f.Stat()
		if err != nil {
			return File{}, err
		}
		d.have = st.Size()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return File{}, err
	}
	if spec.size >= 0 && d.have > spec.size {
		if err := d.restart(); err != nil {
			return File{}, err
		}
	}
	p.Start(name, spec.size, d.have)

	failures := 0
	wait := c.retryWait()
	for d.total < 0 || d.have < d.total {
		before := d.have
		done, err := d.transfer(ctx)
		if done {
			break
		}
		if err == nil {
			continue // restarted from the beginning: go again at once
		}
		if ctx.Err() != nil {
			return File{}, fmt.Errorf("%s: %w (%d of %s bytes kept in %s; pull again to resume)", name, ctx.Err(), d.have, sizeText(d.total), partial)
		}
		var he *HTTPError
		var ue *UnreachableError
		if errors.As(err, &he) && he.Status < 500 && he.Status != http.StatusTooManyRequests ||
			errors.As(err, &ue) && d.have == 0 {
			return File{}, fmt.Errorf("%s: %w", name, err)
		}
		// A transfer that broke after bringing data resumes at once;
		// failures without progress wait longer each time, then give up.
		if d.have > before {
			failures, wait = 0, c.retryWait()
			p.Retry(err, 0)
			continue
		}
		if failures++; failures > c.retries() {
			return File{}, fmt.Errorf("%s: gave up after %d tries without progress (%d of %s bytes kept in %s; pull again to resume): %w",
				name, failures, d.have, sizeText(d.total), partial, err)
		}
		p.Retry(err, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return File{}, fmt.Errorf("%s: %w", name, ctx.Err())
		}
		wait *= 2
	}
	if err := d.create(); err != nil { // an empty file: nothing was written
		return File{}, err
	}
	if err := d.f.Sync(); err != nil {
		return File{}, fmt.Errorf("%s: %w", partial, err)
	}

	// What counts is what is on the disk: its size, and its sha256.
	st, err := d.f.Stat()
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", partial, err)
	}
	if st.Size() != d.have || spec.size >= 0 && st.Size() != spec.size {
		return File{}, fmt.Errorf("%s: %s holds %d bytes, the download %d and the source lists %s", name, partial, st.Size(), d.have, sizeText(spec.size))
	}
	if v, ok := p.(Verifier); ok {
		v.Verifying(name, st.Size())
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(d.f, 0, st.Size())); err != nil {
		return File{}, fmt.Errorf("reading %s back: %w", partial, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	want := spec.sha256
	if want == "" {
		want = d.linked
	}
	if want != "" && got != want {
		d.f.Close()
		d.f = nil
		os.Remove(partial)
		return File{}, &ChecksumError{File: name, Want: want, Got: got}
	}
	if err := d.f.Close(); err != nil {
		return File{}, fmt.Errorf("%s: %w", partial, err)
	}
	d.f = nil
	if err := os.Rename(partial, spec.dest); err != nil {
		return File{}, err
	}
	file := File{Name: name, Size: st.Size(), SHA256: got, Verified: want != "", URL: spec.url}
	p.Done(file)
	return file, nil
}

// create makes the partial file (and its folder) if it is not there yet.
func (d *download) create() error {
	if d.f != nil {
		return nil
	}
	partial := d.spec.dest + partialSuffix
	if err := os.MkdirAll(filepath.Dir(partial), 0o755); err != nil {
		return fmt.Errorf("models directory: %w", err)
	}
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	d.f = f
	if d.spec.created != nil {
		return d.spec.created()
	}
	return nil
}

// write puts b at the end of what was counted, and counts what was
// written. On a failure the file is cut back to that count (a part of b
// may have reached the disk), so the file always holds exactly have bytes.
func (d *download) write(b []byte) error {
	if err := d.create(); err != nil {
		return err
	}
	n, err := d.c.writeAt(d.f, b, d.have)
	d.have += int64(n)
	d.p.Add(int64(n))
	if err != nil {
		d.f.Truncate(d.have)
		return fmt.Errorf("writing %s: %w", d.f.Name(), err)
	}
	return nil
}

// writeAt writes b at off (Client.testWriteAt stands in for it in tests,
// to make a disk full).
func (c *Client) writeAt(f *os.File, b []byte, off int64) (int, error) {
	if c.testWriteAt != nil {
		return c.testWriteAt(f, b, off)
	}
	return f.WriteAt(b, off)
}

func sizeText(n int64) string {
	if n < 0 {
		return "?"
	}
	return strconv.FormatInt(n, 10)
}

// restart empties the partial file: the server sent the whole file, or
// the partial one cannot belong to it.
func (d *download) restart() error {
	if d.f != nil {
		if err := d.f.Truncate(0); err != nil {
			return err
		}
	}
	d.have = 0
	return nil
}

var errStalled = errors.New("no data for too long")

var contentRange = regexp.MustCompile(`^bytes (\d+)-(\d+)/(\d+|\*)$`)

// transfer makes one request for the rest of the file and appends what
// comes. It reports done when the file is complete; (false, nil) when it
// had to start over from the beginning.
func (d *download) transfer(ctx context.Context) (done bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := d.c.newRequest(ctx, d.spec.url)
	if err != nil {
		return false, err
	}
	if d.have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", d.have))
	}
	// The hub says what the file is in its redirect to the CDN.
	hc := d.c.httpClient(func(r *http.Response) {
		if l := linkedDigest(r.Header); l != "" {
			d.linked = l
		}
		if n, err := strconv.ParseInt(r.Header.Get("X-Linked-Size"), 10, 64); err == nil && d.total < 0 {
			d.total = n
		}
	})
	resp, err := hc.Do(req)
	if err != nil {
		return false, requestError(d.spec.url, err)
	}
	defer resp.Body.Close()
	if l := linkedDigest(resp.Header); l != "" {
		d.linked = l
	}
	switch resp.StatusCode {
	case http.StatusOK:
		if d.have > 0 { // the server ignored the range
			if err := d.restart(); err != nil {
				return false, err
			}
		}
		if resp.ContentLength >= 0 {
			if d.total >= 0 && d.total != resp.ContentLength {
				return false, fmt.Errorf("GET %s: %d bytes, the source lists %d", d.spec.url, resp.ContentLength, d.total)
			}
			d.total = resp.ContentLength
		}
	case http.StatusPartialContent:
		m := contentRange.FindStringSubmatch(resp.Header.Get("Content-Range"))
		if m == nil {
			return false, fmt.Errorf("GET %s: 206 with Content-Range %q", d.spec.url, resp.Header.Get("Content-Range"))
		}
		if start, _ := strconv.ParseInt(m[1], 10, 64); start != d.have {
			return false, d.restart()
		}
		if m[3] != "*" {
			n, _ := strconv.ParseInt(m[3], 10, 64)
			if d.total >= 0 && d.total != n {
				return false, fmt.Errorf("GET %s: %d bytes, the source lists %d", d.spec.url, n, d.total)
			}
			d.total = n
		}
	case http.StatusRequestedRangeNotSatisfiable:
		// Asked from the end of the file: it was complete already.
		var n int64 = -1
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes */%d", &n); err == nil && n == d.have && d.have > 0 {
			d.total = n
			return true, nil
		}
		return false, d.restart()
	default:
		return false, httpError(resp)
	}

	// Break off a transfer that stalls; the loop resumes it.
	stalled := time.AfterFunc(d.c.stall(), func() { cancel(errStalled) })
	defer stalled.Stop()
	buf := make([]byte, 1<<20)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			stalled.Reset(d.c.stall())
			if err := d.write(buf[:n]); err != nil {
				return false, err
			}
		}
		if rerr == io.EOF {
			if d.total < 0 {
				d.total = d.have
			}
			if d.have == d.total {
				return true, nil
			}
			return false, fmt.Errorf("GET %s: the transfer ended at %d of %d bytes", d.spec.url, d.have, d.total)
		}
		if rerr != nil {
			if errors.Is(context.Cause(ctx), errStalled) {
				rerr = errStalled
			}
			return false, fmt.Errorf("GET %s: broken off at %d of %s bytes: %w", d.spec.url, d.have, sizeText(d.total), rerr)
		}
	}
}
