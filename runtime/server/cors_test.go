package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestParseCORS(t *testing.T) {
	for _, c := range []struct{ spec, want, err string }{
		{spec: "localhost", want: "localhost"},
		{spec: "*", want: "*"},
		{spec: "none", want: "none"},
		{spec: " HTTPS://App.Example.com:443/ , localhost", want: "localhost,https://app.example.com"},
		{spec: "http://a.example:8080,https://b.example:8443,http://[::1]:3000", want: "http://[::1]:3000,http://a.example:8080,https://b.example:8443"},
		{spec: "null", want: "null"},
		{spec: "http://[::1]", want: "http://[::1]"},
		{spec: "", err: "empty"},
		{spec: " , ", err: "empty"},
		{spec: "none,localhost", err: "cannot be combined"},
		{spec: "app.example.com", err: "is not an origin"},
		{spec: "https://app.example.com/chat", err: "without a path"},
		{spec: "https://user@app.example.com", err: "without a path, query or user"},
		{spec: "https://*.example.com", err: "wildcards"},
	} {
		p, err := ParseCORS(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseCORS(%q) = %v, want an error with %q", c.spec, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseCORS(%q): %v", c.spec, err)
			continue
		}
		if got := p.String(); got != c.want {
			t.Errorf("ParseCORS(%q) = %q, want %q", c.spec, got, c.want)
		}
	}
}

func TestCORSAllows(t *testing.T) {
	for _, c := range []struct {
		spec   string
		allow  []string
		refuse []string
	}{
		{spec: "localhost",
			allow: []string{"http://localhost:5173", "http://localhost", "https://localhost:8443", "http://127.0.0.1:3000",
				"http://127.0.0.2", "http://[::1]:8080", "HTTP://LOCALHOST:1"},
			refuse: []string{"", "null", "http://localhost.example.com", "http://127.0.0.1.nip.io", "https://app.example.com",
				"file://", "chrome-extension://abc", "http://[::2]", "http://192.168.1.5:8080"}},
		{spec: "https://app.example.com",
			allow:  []string{"https://app.example.com", "https://app.example.com:443"},
			refuse: []string{"http://app.example.com", "https://app.example.com:8443", "https://evil.app.example.com", "http://localhost:3000"}},
		{spec: "*", allow: []string{"https://anything.example", "null", "http://localhost"}, refuse: []string{""}},
		{spec: "none", refuse: []string{"http://localhost", "https://app.example.com", "null"}},
		{spec: "null,localhost", allow: []string{"null", "http://localhost:1"}, refuse: []string{"https://app.example.com"}},
	} {
		p, err := ParseCORS(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range c.allow {
			if !p.Allows(o) {
				t.Errorf("--cors %s refuses %q", c.spec, o)
			}
		}
		for _, o := range c.refuse {
			if p.Allows(o) {
				t.Errorf("--cors %s allows %q", c.spec, o)
			}
		}
	}
}

// corsRequest sends a request with the given headers ("Name: value").
func corsRequest(t *testing.T, method, url, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestCORSPreflightAndKey(t *testing.T) {
	ts := startServer(t, Config{APIKey: "k"}) // default policy: localhost
	chat := ts.url + "/v1/chat/completions"
	const local = "Origin: http://localhost:5173"
	const key = "Authorization: Bearer k"

	// The preflight needs no key and allows what the browser asks for.
	resp, body := corsRequest(t, "OPTIONS", chat, "", local, "Access-Control-Request-Method: POST",
		"Access-Control-Request-Headers: authorization, content-type, x-stainless-os")
	h := resp.Header
	if resp.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != "http://localhost:5173" ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
		h.Get("Access-Control-Allow-Headers") != "authorization, content-type, x-stainless-os" ||
		h.Get("Access-Control-Max-Age") == "" || !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
		t.Errorf("preflight: %d %v %s", resp.StatusCode, h, body)
	}
	if h.Get("Access-Control-Allow-Credentials") != "" {
		t.Error("credentials allowed: ats uses no cookies")
	}

	// Refused origin: the preflight says why.
	resp, body = corsRequest(t, "OPTIONS", chat, "", "Origin: https://evil.example", "Access-Control-Request-Method: POST")
	if resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" || !strings.Contains(body, "--cors") {
		t.Errorf("refused preflight: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	// OPTIONS that is not a preflight: the methods.
	resp, _ = corsRequest(t, "OPTIONS", ts.url+"/v1/models", "")
	if resp.StatusCode != 204 || resp.Header.Get("Allow") != "GET, HEAD, OPTIONS" {
		t.Errorf("plain OPTIONS: %d Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	if resp, _ := corsRequest(t, "OPTIONS", ts.url+"/v1/nope", "", local, "Access-Control-Request-Method: GET"); resp.StatusCode != 404 {
		t.Errorf("preflight of an unknown path: %d", resp.StatusCode)
	}

	// The key is still required, and its refusal is readable by the page.
	resp, body = corsRequest(t, "GET", ts.url+"/v1/models", "", local)
	if resp.StatusCode != 401 || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Errorf("no key: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, body = corsRequest(t, "GET", ts.url+"/v1/models", "", local, key)
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "Retry-After") {
		t.Errorf("with the key: %d %v %s", resp.StatusCode, resp.Header, body)
	}

	// A real request from a browser page of an allowed origin.
	req := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`
	resp, body = corsRequest(t, "POST", chat, req, local, key, "Sec-Fetch-Site: same-site", "Content-Type: application/json")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Errorf("allowed POST: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	// From an origin that is not allowed, a POST never reaches the model,
	// even a "simple" one that needs no preflight.
	before := ts.metric(t, "ats_generated_tokens_total")
	for _, hs := range [][]string{
		{"Origin: https://evil.example", "Sec-Fetch-Site: cross-site", "Content-Type: text/plain"},
		{"Origin: https://evil.example", "Content-Type: text/plain"}, // an older browser: no Sec-Fetch-Site
	} {
		resp, body = corsRequest(t, "POST", chat, req, append(hs, key)...)
		if resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" || !strings.Contains(body, "origin_not_allowed") {
			t.Errorf("refused POST %v: %d %v %s", hs, resp.StatusCode, resp.Header, body)
		}
	}
	if after := ts.metric(t, "ats_generated_tokens_total"); after != before {
		t.Errorf("a refused request generated %v tokens", after-before)
	}
	// GET from such an origin: answered (reading is harmless) but without
	// the header, so the page cannot read it.
	resp, _ = corsRequest(t, "GET", ts.url+"/health", "", "Origin: https://evil.example", "Sec-Fetch-Site: cross-site")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("GET from a refused origin: %d %v", resp.StatusCode, resp.Header)
	}
	// Programs that are not browsers send no Origin: unaffected.
	if resp, body := corsRequest(t, "POST", chat, req, key); resp.StatusCode != 200 {
		t.Errorf("no Origin: %d %s", resp.StatusCode, body)
	}
}

func TestCORSPolicies(t *testing.T) {
	none, _ := ParseCORS("none")
	all, _ := ParseCORS("*")
	req := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}`

	// With no origin allowed, the server's own pages still work: the
	// browser says same-origin, or the Origin matches the Host.
	ts := startServer(t, Config{CORS: none})
	host := strings.TrimPrefix(ts.url, "http://")
	for _, hs := range [][]string{
		{"Origin: " + ts.url, "Sec-Fetch-Site: same-origin"},
		{"Origin: " + ts.url},
		{"Origin: http://" + host},
	} {
		resp, body := corsRequest(t, "POST", ts.url+"/v1/chat/completions", req, hs...)
		if resp.StatusCode != 200 {
			t.Errorf("same origin %v: %d %s", hs, resp.StatusCode, body)
		}
	}
	resp, _ := corsRequest(t, "POST", ts.url+"/v1/chat/completions", req, "Origin: http://localhost:5173", "Sec-Fetch-Site: same-site")
	if resp.StatusCode != 403 {
		t.Errorf("--cors none, localhost page: %d", resp.StatusCode)
	}

	// "*": any origin, answered with "*".
	ts = startServer(t, Config{CORS: all})
	resp, body := corsRequest(t, "POST", ts.url+"/v1/chat/completions", req, "Origin: https://app.example.com", "Sec-Fetch-Site: cross-site")
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("--cors *: %d %v %s", resp.StatusCode, resp.Header, body)
	}
}
