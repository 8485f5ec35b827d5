package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultEndpoint is the Hugging Face hub.
const DefaultEndpoint = "https://huggingface.co"

// Client talks to the hub and downloads files.
type Client struct {
	// Endpoint is the hub's address: $HF_ENDPOINT (a mirror) or
	// https://huggingface.co.
	Endpoint string
	// Token ($HF_TOKEN) is sent to the endpoint's host only, for gated
	// and private repositories; redirects to other hosts go without it.
	Token string
	// HTTP makes the requests; nil: one with time limits on connecting
	// and on the response headers, none on the body.
	HTTP *http.Client
	// Retries is how many times a broken transfer is resumed in a row
	// without progress before pull gives up (default 5); RetryWait the
	// wait before the first retry, doubled after each (default 1s).
	Retries   int
	RetryWait time.Duration
	// Stall is how long a transfer may go without a byte before it is
	// broken off and resumed (default 60s).
	Stall time.Duration

	// testWriteAt, when set, writes the downloaded bytes instead of
	// os.File.WriteAt (tests: a disk that fills up).
	testWriteAt func(f *os.File, b []byte, off int64) (int, error)
}

// NewClient is a client for $HF_ENDPOINT (default the hub) with $HF_TOKEN.
func NewClient() *Client {
	ep := os.Getenv("HF_ENDPOINT")
	if ep == "" {
		ep = DefaultEndpoint
	}
	return &Client{Endpoint: strings.TrimSuffix(ep, "/"), Token: os.Getenv("HF_TOKEN")}
}

// httpClient is the client for one request; seen, when not nil, hears the
// response of every redirect.
func (c *Client) httpClient(seen func(*http.Response)) *http.Client {
	var hc http.Client
	if c.HTTP != nil {
		hc = *c.HTTP
	} else {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = 60 * time.Second
		hc.Transport = t
	}
	hc.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		// The token is for the hub: not for its CDN, nor for any other
		// host (or port) a redirect leads to.
		if !c.isEndpoint(r.URL) {
			r.Header.Del("Authorization")
		}
		if seen != nil {
			seen(r.Response)
		}
		return nil
	}
	return &hc
}

// isEndpoint reports whether u is on the hub's host and port.
func (c *Client) isEndpoint(u *url.URL) bool {
	ep, err := url.Parse(c.Endpoint)
	return err == nil && strings.EqualFold(ep.Host, u.Host) && ep.Scheme == u.Scheme
}

func (c *Client) retries() int {
	if c.Retries > 0 {
		return c.Retries
	}
	return 5
}

func (c *Client) retryWait() time.Duration {
	if c.RetryWait > 0 {
		return c.RetryWait
	}
	return time.Second
}

func (c *Client) stall() time.Duration {
	if c.Stall > 0 {
		return c.Stall
	}
	return 60 * time.Second
}

// UnreachableError says that a host could not be reached at all: no
// network, a name that does not resolve, a refused connection.
type UnreachableError struct {
	Host string
	URL  string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach %s (%s): %v", e.Host, e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// HTTPError is a response other than success.
type HTTPError struct {
	URL    string
	Status int
	Msg    string // the server's explanation, where it gave one
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("GET %s: %d %s", e.URL, e.Status, http.StatusText(e.Status))
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		s += " (a gated or private repository needs a token: accept its terms on the hub, then set HF_TOKEN)"
	}
	return s
}

// requestError classifies a failed request: a host never reached is an
// UnreachableError, anything else is returned as it is.
func requestError(u string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && (ue.Timeout() || isDialError(ue.Err)) {
		host := u
		if p, perr := url.Parse(u); perr == nil {
			host = p.Host
		}
		return &UnreachableError{Host: host, URL: u, Err: ue.Err}
	}
	return err
}

func isDialError(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial"
}

// newRequest makes a GET for u, with the token when u is on the hub.
func (c *Client) newRequest(ctx context.Context, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "ats")
	if c.Token != "" && c.isEndpoint(req.URL) {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

func httpError(resp *http.Response) error {
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		var j struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &j) == nil && j.Error != "" {
			msg = j.Error
		}
	}
	return &HTTPError{URL: resp.Request.URL.String(), Status: resp.StatusCode, Msg: msg}
}

// RepoFile is one file of a hub repository as the API lists it.
type RepoFile struct {
	Path   string // rfilename
	Size   int64  // -1 when the listing gives none
	SHA256 string // of an LFS file; "" for files kept in git
}

// RepoInfo is what the hub says about a model repository.
type RepoInfo struct {
	ID    string // ORG/REPO as the hub spells it
	SHA   string // the commit of the main branch
	Files []RepoFile
}

// Repo lists a repository's files with their sizes and checksums:
// GET /api/models/ORG/REPO?blobs=true.
func (c *Client) Repo(ctx context.Context, repo string) (*RepoInfo, error) {
	u := c.Endpoint + "/api/models/" + escapePath(repo) + "?blobs=true"
	req, err := c.newRequest(ctx, u)
	if err != nil {
		return nil, err
	}
	resp, err := c.httpClient(nil).Do(req)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", repo, requestError(u, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := httpError(resp)
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("no repository %s on %s (%w)", repo, c.Endpoint, err)
		}
		return nil, fmt.Errorf("listing %s: %w", repo, err)
	}
	var body struct {
		ID       string `json:"id"`
		SHA      string `json:"sha"`
		Siblings []struct {
			RFilename string `json:"rfilename"`
			Size      *int64 `json:"size"`
			LFS       *struct {
				SHA256 string `json:"sha256"`
				Size   int64  `json:"size"`
			} `json:"lfs"`
		} `json:"siblings"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("listing %s: reading the hub's answer: %w", repo, err)
	}
	info := &RepoInfo{ID: body.ID, SHA: body.SHA}
	if info.ID == "" {
		info.ID = repo
	}
	for _, s := range body.Siblings {
		f := RepoFile{Path: s.RFilename, Size: -1}
		if s.Size != nil {
			f.Size = *s.Size
		}
		if s.LFS != nil {
			f.SHA256 = strings.ToLower(s.LFS.SHA256)
			if f.Size < 0 {
				f.Size = s.LFS.Size
			}
		}
		info.Files = append(info.Files, f)
	}
	return info, nil
}

// ResolveURL is the download address of a file of a repository at a
// revision (a branch or a commit).
func (c *Client) ResolveURL(repo, revision, file string) string {
	return c.Endpoint + "/" + escapePath(repo) + "/resolve/" + url.PathEscape(revision) + "/" + escapePath(file)
}

// escapePath escapes each segment of a slash-separated path.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}
