package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestServeCORS: --cors replaces the default (localhost) with its list,
// "*" without a key is warned about, and a bad list fails before the
// model loads.
func TestServeCORS(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	url, stderr, stop := startServe(t, "-m", m, "--cors", "https://app.example.com")
	preflight := func(origin string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("OPTIONS", url+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := preflight("https://app.example.com"); r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Errorf("listed origin: %d %v", r.StatusCode, r.Header)
	}
	if r := preflight("http://localhost:5173"); r.StatusCode != 403 {
		t.Errorf("localhost, not listed: %d", r.StatusCode)
	}
	stop()
	if strings.Contains(stderr.String(), "--cors *") {
		t.Errorf("warned about --cors * without it:\n%s", stderr)
	}

	_, stderr, stop = startServe(t, "-m", m, "--cors", "*")
	stop()
	if !strings.Contains(stderr.String(), "--cors * without --api-key") {
		t.Errorf("no warning for --cors * without a key:\n%s", stderr)
	}

	_, errOut, err := runATSIn(t, "", "serve", "-m", "/nonexistent.gguf", "--cors", "app.example.com")
	if err == nil || !strings.Contains(err.Error(), "--cors") || strings.Contains(errOut, "nonexistent") {
		t.Errorf("bad --cors: %v\n%s", err, errOut)
	}
}
