package server

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, url string, headers ...string) (*http.Response, string) {
	t.Helper()
	return corsRequest(t, "GET", url, "", headers...)
}

// TestWebUIServed checks the pages and what they load, without a browser.
func TestWebUIServed(t *testing.T) {
	ts := startServer(t, Config{APIKey: "k"})

	for path, want := range map[string]string{"/": "chat.js", "/machine": "machine.js"} {
		resp, body := get(t, ts.url+path)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s without the key: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if !strings.Contains(body, want) {
			t.Errorf("GET %s does not load %s", path, want)
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !containsAll(csp, "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
		// Everything the page loads exists, with its type.
		for _, m := range regexp.MustCompile(`(?:src|href)="(/ui/[^"]+)"`).FindAllStringSubmatch(body, -1) {
			r, _ := get(t, ts.url+m[1])
			if r.StatusCode != 200 {
				t.Errorf("%s loads %s: %d", path, m[1], r.StatusCode)
			}
			if strings.HasSuffix(m[1], ".js") && !strings.Contains(r.Header.Get("Content-Type"), "javascript") {
				t.Errorf("%s: Content-Type %q", m[1], r.Header.Get("Content-Type"))
			}
		}
	}
	// The modules' imports exist too.
	for _, js := range []string{"chat.js", "machine.js"} {
		_, body := get(t, ts.url+"/ui/"+js)
		for _, m := range regexp.MustCompile(`from "\./([^"]+)"`).FindAllStringSubmatch(body, -1) {
			if r, _ := get(t, ts.url+"/ui/"+m[1]); r.StatusCode != 200 {
				t.Errorf("%s imports %s: %d", js, m[1], r.StatusCode)
			}
		}
	}

	// Revalidation by ETag; HEAD.
	resp, _ := get(t, ts.url+"/ui/style.css")
	etag := resp.Header.Get("ETag")
	if etag == "" || resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("style.css headers %v", resp.Header)
	}
	if resp, body := get(t, ts.url+"/ui/style.css", "If-None-Match: "+etag); resp.StatusCode != 304 || body != "" {
		t.Errorf("If-None-Match: %d, %d bytes", resp.StatusCode, len(body))
	}
	head, _ := corsRequest(t, "HEAD", ts.url+"/", "")
	if head.StatusCode != 200 || head.ContentLength <= 0 {
		t.Errorf("HEAD /: %d, length %d", head.StatusCode, head.ContentLength)
	}

	// Only the UI's own files, and only for reading.
	for _, path := range []string{"/ui/", "/ui/nope.js", "/ui/../server.go", "/index.html", "/machine/"} {
		if code, e, _ := do(t, "GET", ts.url+path, "", "Authorization", "Bearer k"); code != 404 || e.Error.Type != typeNotFound {
			t.Errorf("GET %s: %d %+v", path, code, e.Error)
		}
	}
	if code, _, hdr := do(t, "POST", ts.url+"/", "{}"); code != 405 || hdr.Get("Allow") != "GET" {
		t.Errorf("POST /: %d, Allow %q", code, hdr.Get("Allow"))
	}
	// The API behind the pages still needs the key.
	if code, _, _ := do(t, "GET", ts.url+"/metrics", ""); code != 401 {
		t.Errorf("/metrics without the key: %d", code)
	}
	// The pages are counted in the metrics under one label.
	req, _ := http.NewRequest("GET", ts.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer k")
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	mtext, _ := io.ReadAll(mresp.Body)
	if !strings.Contains(string(mtext), `ats_requests_total{code="200",endpoint="webui"}`) {
		t.Errorf("no webui requests in /metrics")
	}
}
