package server

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// doHost sends a request with the given Host header (Go's client takes it
// from req.Host, not from the headers).
func doHost(t *testing.T, method, url, host, body string, header ...string) (int, errorBody, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e errorBody
	if resp.StatusCode != 200 {
		json.Unmarshal(raw, &e)
	}
	return resp.StatusCode, e, string(raw)
}

// Issue 33, DNS rebinding: a page of attacker.example that rebinds its
// name to this server sends the server's requests with its own Host, and
// its Origin matches it, so they pass as same-origin. The Host gives it
// away: the server refuses every request that names another host, the
// whole API, /props and pprof included.
func TestDNSRebindingRefused(t *testing.T) {
	ts := startServer(t, Config{PProf: true})
	port := ts.url[strings.LastIndex(ts.url, ":")+1:]
	attacker := "attacker.example:" + port
	rebound := []string{"Origin", "http://" + attacker, "Sec-Fetch-Site", "same-origin", "Content-Type", "text/plain"}
	chatBody := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/chat/completions", chatBody},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":2}`},
		{"GET", "/props", ""},
		{"GET", "/v1/models", ""},
		{"POST", "/tokenize", `{"content":"hi"}`},
		{"GET", "/metrics", ""},
		{"GET", "/debug/pprof/cmdline", ""},
		{"GET", "/", ""},
	} {
		status, e, raw := doHost(t, c.method, ts.url+c.path, attacker, c.body, rebound...)
		if status != http.StatusForbidden || e.Error.Code == nil || *e.Error.Code != "host_not_allowed" {
			t.Errorf("%s %s with Host %s: %d %.200s; want 403 host_not_allowed", c.method, c.path, attacker, status, raw)
		}
		if strings.Contains(raw, "ats-") || strings.Contains(raw, "n_ctx") {
			t.Errorf("%s %s: the refusal leaks the server's data: %.200s", c.method, c.path, raw)
		}
	}
	// Names that only this machine can mean pass, with or without a port.
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "127.9.9.9", "LOCALHOST", "localhost.", "app.localhost:" + port, "[::1]:" + port, "0.0.0.0:" + port} {
		if status, e, _ := doHost(t, "POST", ts.url+"/v1/chat/completions", host, chatBody); status != 200 {
			t.Errorf("Host %s: %d %+v", host, status, e.Error)
		}
	}
	for _, host := range []string{"localhost.attacker.example", "127.0.0.1.nip.io:" + port, "evil:" + port} {
		if status, _, _ := doHost(t, "GET", ts.url+"/v1/models", host, ""); status != http.StatusForbidden {
			t.Errorf("Host %s: %d, want 403", host, status)
		}
	}
}

// --allowed-hosts names the hosts a server behind a name answers to.
func TestAllowedHosts(t *testing.T) {
	ts := startServer(t, Config{AllowedHosts: []string{"ats.example.com, .corp.example", "192.0.2.7"}})
	for host, want := range map[string]int{
		"ats.example.com":         200,
		"ATS.example.com:8443":    200,
		"corp.example":            200,
		"gpu1.lab.corp.example":   200,
		"192.0.2.7:8080":          200,
		"example.com":             403,
		"notcorp.example":         403,
		"ats.example.com.evil.io": 403,
	} {
		if status, _, _ := doHost(t, "GET", ts.url+"/v1/models", host, ""); status != want {
			t.Errorf("Host %s: %d, want %d", host, status, want)
		}
	}
	for _, bad := range []string{"ats.example.com:80", "http://ats.example.com", "*.example.com", "."} {
		if _, err := ParseAllowedHosts([]string{bad}); err == nil {
			t.Errorf("ParseAllowedHosts(%q) accepted", bad)
		}
	}
	any, err := ParseAllowedHosts([]string{"*"})
	if err != nil || !any.allowsHost(&http.Request{Host: "whatever.example"}) {
		t.Errorf("* does not allow every host: %v", err)
	}
}

// The address a connection reached is this server's own, whatever it is:
// a server listening on all interfaces answers by its LAN address.
func TestHostIsLocalAddress(t *testing.T) {
	var ip net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("this machine has no non-loopback IPv4 address")
	}
	sess := oracleSession(t, "tiny-qwen3-q4_k_m.gguf")
	s, err := New(sess, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Skip(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	url := "http://" + ln.Addr().String()
	if status, e, _ := doHost(t, "GET", url+"/v1/models", "", ""); status != 200 {
		t.Errorf("Host %s (the listening address): %d %+v", ln.Addr(), status, e.Error)
	}
	if status, _, _ := doHost(t, "GET", url+"/v1/models", "192.0.2.99", ""); status != 403 {
		t.Errorf("another address: %d, want 403", status)
	}
}

// While the model loads, other Hosts get 403 too, not the model's name.
func TestRebindingWhileLoading(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	st := Listen(ln, Config{ModelName: "secret-model"})
	defer st.hs.Close()
	status, e, raw := doHost(t, "GET", url+"/health", "attacker.example", "")
	if status != http.StatusForbidden || e.Error.Code == nil || *e.Error.Code != "host_not_allowed" || strings.Contains(raw, "secret-model") {
		t.Errorf("/health while loading, Host attacker.example: %d %s", status, raw)
	}
	if status, _, _ := doHost(t, "GET", url+"/health", "", ""); status != http.StatusServiceUnavailable {
		t.Errorf("/health while loading: %d, want 503 loading", status)
	}
}
