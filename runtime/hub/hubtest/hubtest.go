// Package hubtest is a local stand-in for the Hugging Face hub's download
// protocol, for tests of `ats pull`: the model API's file listing with
// sizes and LFS sha256 (GET /api/models/ORG/REPO?blobs=true), downloads by
// /ORG/REPO/resolve/REV/FILE answered with a redirect to a CDN-like path
// (with X-Linked-Etag, X-Linked-Size and X-Repo-Commit, as the hub sends
// them), Range requests there, and faults on demand: transfers cut off
// midway, a server that ignores Range, a listing with a wrong checksum, a
// gated repository.
package hubtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"time"
)

// Repo is a model repository.
type Repo struct {
	ID    string            // ORG/REPO
	SHA   string            // the main branch's commit
	Files map[string][]byte // path in the repository -> content
	// InGit are files kept in git, not LFS: listed without lfs, served
	// without a redirect or X-Linked-Etag.
	InGit map[string]bool
	// WrongSHA are files whose listed and linked sha256 is wrong.
	WrongSHA map[string]bool
	// Token, when set, makes the repository gated, as the hub does: it is
	// listed to anyone, but its files are served only with
	// "Authorization: Bearer TOKEN".
	Token string
}

// Server is the stand-in hub; it also serves plain files under /files/.
type Server struct {
	*httptest.Server

	mu      sync.Mutex
	repos   map[string]*Repo
	digests map[*byte]string // SHA256 of a file's content, by its first byte's address
	plain   map[string][]byte
	// CutAfter > 0 breaks off each of the next Cuts transfers from the CDN
	// after that many bytes of body.
	CutAfter int64
	Cuts     int
	// StallAfter > 0 makes each of the next Stalls transfers stop sending
	// after that many bytes of body, holding the connection open.
	StallAfter int64
	Stalls     int
	// IgnoreRange makes the CDN answer every request with the whole file.
	IgnoreRange bool
	// CDN, when set, is the base URL the resolve redirects go to (another
	// Server holding the same files, as the hub's CDN is another host);
	// by default this server's /cdn/.
	CDN string
	log []Request
}

// Request is one request the server saw.
type Request struct {
	Method, Path, Range, Auth string
}

// New starts a server with the repositories.
func New(repos ...*Repo) *Server {
	s := &Server{repos: map[string]*Repo{}, plain: map[string][]byte{}, digests: map[*byte]string{}}
	for _, r := range repos {
		if r.SHA == "" {
			r.SHA = fmt.Sprintf("%040x", len(r.ID))
		}
		s.repos[strings.ToLower(r.ID)] = r
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// AddFile serves content at /files/NAME (a plain URL, no checksum sent).
func (s *Server) AddFile(name string, content []byte) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plain[name] = content
	return s.URL + "/files/" + name
}

// Requests returns the requests seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// SHA256 is the hex digest of b.
func SHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.log = append(s.log, Request{r.Method, r.URL.Path, r.Header.Get("Range"), r.Header.Get("Authorization")})
	s.mu.Unlock()
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/api/models/"):
		s.listing(w, r, strings.TrimPrefix(p, "/api/models/"))
	case strings.HasPrefix(p, "/cdn/"):
		s.cdn(w, r, strings.TrimPrefix(p, "/cdn/"))
	case strings.HasPrefix(p, "/files/"):
		s.mu.Lock()
		b, ok := s.plain[strings.TrimPrefix(p, "/files/")]
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		s.content(w, r, b)
	case strings.Contains(p, "/resolve/"):
		s.resolve(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) repo(w http.ResponseWriter, r *http.Request, id string, download bool) *Repo {
	s.mu.Lock()
	repo := s.repos[strings.ToLower(id)]
	s.mu.Unlock()
	if repo == nil {
		w.Header().Set("X-Error-Code", "RepoNotFound")
		w.Header().Set("X-Error-Message", "Repository not found")
		http.Error(w, `{"error":"Repository not found"}`, http.StatusNotFound)
		return nil
	}
	if download && repo.Token != "" && r.Header.Get("Authorization") != "Bearer "+repo.Token {
		w.Header().Set("X-Error-Code", "GatedRepo")
		w.Header().Set("X-Error-Message", "Access to model "+repo.ID+" is restricted.")
		http.Error(w, `{"error":"Access to model is restricted"}`, http.StatusUnauthorized)
		return nil
	}
	return repo
}

// sum is SHA256(b), computed once per content.
func (s *Server) sum(b []byte) string {
	if len(b) == 0 {
		return SHA256(b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.digests[&b[0]]
	if !ok {
		d = SHA256(b)
		s.digests[&b[0]] = d
	}
	return d
}

// digest is the sha256 the hub publishes for a file: wrong where the
// repository says so.
func (s *Server) digest(repo *Repo, path string) string {
	if repo.WrongSHA[path] {
		return SHA256(append([]byte("not "), repo.Files[path]...))
	}
	return s.sum(repo.Files[path])
}

// listing answers GET /api/models/ORG/REPO[/revision/REV][?blobs=true].
func (s *Server) listing(w http.ResponseWriter, r *http.Request, rest string) {
	id, _, _ := strings.Cut(rest, "/revision/")
	repo := s.repo(w, r, id, false)
	if repo == nil {
		return
	}
	type lfs struct {
		SHA256      string `json:"sha256"`
		Size        int    `json:"size"`
		PointerSize int    `json:"pointerSize"`
	}
	type sibling struct {
		RFilename string `json:"rfilename"`
		Size      *int   `json:"size,omitempty"`
		BlobID    string `json:"blobId,omitempty"`
		LFS       *lfs   `json:"lfs,omitempty"`
	}
	blobs := r.URL.Query().Get("blobs") == "true"
	var paths []string
	for p := range repo.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var sib []sibling
	for _, p := range paths {
		sb := sibling{RFilename: p}
		if blobs {
			n := len(repo.Files[p])
			sb.Size = &n
			sb.BlobID = fmt.Sprintf("%040x", n)
			if !repo.InGit[p] {
				sb.LFS = &lfs{SHA256: s.digest(repo, p), Size: n, PointerSize: 134}
			}
		}
		sib = append(sib, sb)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"_id": "0123", "id": repo.ID, "modelId": repo.ID, "sha": repo.SHA, "private": false,
		"gated": repo.Token != "", "tags": []string{"gguf"}, "siblings": sib,
		"lastModified": "2025-05-01T00:00:00.000Z",
	})
}

// resolve answers /ORG/REPO/resolve/REV/PATH: a redirect to the CDN for
// an LFS file, the file itself for one in git.
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	before, after, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/resolve/")
	repo := s.repo(w, r, before, true)
	if repo == nil {
		return
	}
	rev, file, ok := strings.Cut(after, "/")
	if !ok || rev != "main" && rev != repo.SHA {
		w.Header().Set("X-Error-Code", "RevisionNotFound")
		http.Error(w, "Invalid rev id: "+rev, http.StatusNotFound)
		return
	}
	b, ok := repo.Files[file]
	if !ok {
		w.Header().Set("X-Error-Code", "EntryNotFound")
		w.Header().Set("X-Error-Message", "Entry not found")
		http.Error(w, "Entry not found", http.StatusNotFound)
		return
	}
	w.Header().Set("X-Repo-Commit", repo.SHA)
	if repo.InGit[file] {
		w.Header().Set("ETag", fmt.Sprintf(`"%040x"`, len(b)))
		s.content(w, r, b)
		return
	}
	d := s.digest(repo, file)
	w.Header().Set("X-Linked-Etag", `"`+d+`"`)
	w.Header().Set("X-Linked-Size", fmt.Sprint(len(b)))
	w.Header().Set("ETag", `"`+d+`"`)
	w.Header().Set("Location", s.CDN+"/cdn/"+s.sum(b)+"?response-content-disposition=attachment")
	w.WriteHeader(http.StatusFound)
}

// cdn serves a blob by its real digest.
func (s *Server) cdn(w http.ResponseWriter, r *http.Request, digest string) {
	s.mu.Lock()
	var files [][]byte
	for _, repo := range s.repos {
		for _, c := range repo.Files {
			files = append(files, c)
		}
	}
	s.mu.Unlock()
	var b []byte
	found := false
	for _, c := range files {
		if s.sum(c) == digest {
			b, found = c, true
		}
	}
	if !found {
		http.NotFound(w, r)
		return
	}
	s.content(w, r, b)
}

// content serves b with Range support, breaking off or ignoring ranges as
// the server's faults say.
func (s *Server) content(w http.ResponseWriter, r *http.Request, b []byte) {
	s.mu.Lock()
	cut := int64(0)
	if s.Cuts > 0 && s.CutAfter > 0 {
		s.Cuts--
		cut = s.CutAfter
	}
	stall := int64(0)
	if s.Stalls > 0 && s.StallAfter > 0 {
		s.Stalls--
		stall = s.StallAfter
	}
	ignore := s.IgnoreRange
	s.mu.Unlock()
	if ignore {
		r.Header.Del("Range")
	}
	var out http.ResponseWriter = w
	if cut > 0 {
		out = &cutWriter{ResponseWriter: w, left: cut}
	}
	if stall > 0 {
		out = &cutWriter{ResponseWriter: w, left: stall, hold: r.Context().Done()}
	}
	http.ServeContent(out, r, "", time.Time{}, bytes.NewReader(b))
}

// cutWriter breaks the connection off after left bytes of body: the
// client sees the transfer end early, as on a dropped connection. With
// hold, it first waits for it to close: a stalled transfer.
type cutWriter struct {
	http.ResponseWriter
	left int64
	hold <-chan struct{}
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if int64(len(p)) <= c.left {
		c.left -= int64(len(p))
		return c.ResponseWriter.Write(p)
	}
	c.ResponseWriter.Write(p[:c.left])
	c.left = 0
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	if c.hold != nil {
		<-c.hold
	}
	panic(http.ErrAbortHandler)
}
