package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// attackPage is what a DNS rebinding attacker serves from its own name:
// once the name points at the victim's server, the page's requests go
// there as same-origin ones, and the script reads what comes back.
const attackPage = `<!doctype html><title>cats</title><script>
window.result = null;
(async () => {
  const out = {};
  for (const [name, path, init] of [
    ["props", "/props", {}],
    ["models", "/v1/models", {}],
    ["chat", "/v1/chat/completions", {method: "POST", headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({messages: [{role: "user", content: "hi"}], max_tokens: 3})}],
  ]) {
    try {
      const r = await fetch(path, init);
      out[name] = {status: r.status, body: (await r.text()).slice(0, 300)};
    } catch (e) {
      out[name] = {status: 0, body: String(e)};
    }
  }
  window.result = JSON.stringify(out);
})();
</script>`

// rebindingResult loads the attacker's page in Chromium, with the
// attacker's name resolving to the loopback server (as after the rebind),
// and returns what its script could read.
func rebindingResult(t *testing.T, cfg Config) string {
	b := newBrowser(t, 800, 600, chromedp.Flag("host-resolver-rules", "MAP attacker.example 127.0.0.1"))
	ts := startServer(t, cfg)
	// One port, two servers in turn: before the rebind the attacker's
	// machine answers attacker.example:PORT with its page; after it, the
	// same name and port reach ats. The test serves the page from its own
	// path in front of the server to stand for the first.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/cats.html" {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte(attackPage))
			return
		}
		ts.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	port := front.URL[strings.LastIndex(front.URL, ":")+1:]
	b.do(chromedp.Navigate("http://attacker.example:" + port + "/cats.html"))
	b.wait("the attack script", `window.result !== null`, 30*time.Second)
	return evalJS[string](b, `window.result`)
}

// Issue 33: a page served from another Host (attacker.example, rebound to
// the server's address) cannot read the API. With the name allowed (the
// same setup, --allowed-hosts attacker.example) the page reads it all,
// which shows the test would see the attack.
func TestDNSRebindingInBrowser(t *testing.T) {
	got := rebindingResult(t, Config{})
	for _, leak := range []string{`"status":200`, "n_ctx", `"object":"list"`, "chat.completion"} {
		if strings.Contains(got, leak) {
			t.Errorf("the rebound page read the API (%s): %s", leak, got)
		}
	}
	if strings.Count(got, `"status":403`) != 3 || !strings.Contains(got, "is not one this server answers to") {
		t.Errorf("want three 403 answers refusing the Host: %s", got)
	}

	open := rebindingResult(t, Config{AllowedHosts: []string{"attacker.example"}})
	if strings.Count(open, `"status":200`) != 3 || !strings.Contains(open, "n_ctx") || !strings.Contains(open, "chat.completion") {
		t.Errorf("with the name allowed, the page should read the API; it got: %s", open)
	}
}
