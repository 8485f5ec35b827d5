package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
)

// The chat page's markdown, its sanitising, regenerate and edit-and-resend,
// and the machine page's first state, in headless Chromium (helpers in
// webui_browser_test.go).

// sayInTurn makes the server's model reply replies[0], then replies[1],
// ... (the last one again once they run out), recording each rendered
// prompt.
func sayInTurn(s *Server, replies []string) (prompts func() []string) {
	var mu sync.Mutex
	var seen []string
	n := 0
	s.testHookPrompt = func(p string) {
		mu.Lock()
		seen = append(seen, p)
		mu.Unlock()
	}
	s.gen = func(ctx context.Context, ids []int, opt session.GenerateOptions) (*session.GenerateResult, error) {
		mu.Lock()
		text := replies[min(n, len(replies)-1)]
		n++
		mu.Unlock()
		res := &session.GenerateResult{PromptTokens: len(ids), StopReason: session.StopEOG, Text: text}
		for rest := text; rest != ""; {
			k := min(len(rest), 5)
			res.Tokens = append(res.Tokens, 0)
			if err := opt.OnText(rest[:k]); err != nil {
				return res, err
			}
			rest = rest[k:]
		}
		return res, nil
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

const markdownReply = "## Steps\n\n" +
	"1. Install **Go** and *nothing else*.\n" +
	"2. Run `go build ./cmd/ats`.\n\n" +
	"- [x] done\n- [ ] to do\n\n" +
	"```go\nfunc main() {\n\tprintln(\"a < b && c\")\n}\n```\n\n" +
	"| flag | meaning |\n| --- | ---: |\n| `-n` | tokens |\n\n" +
	"> A quote, and a [link](https://example.com/docs \"docs\").\n\n" +
	"Fish &amp; chips, ~~old~~ new."

// TestWebUIMarkdown: a reply in markdown shows as headings, lists, code
// blocks with a copy button, tables, quotes and links.
func TestWebUIMarkdown(t *testing.T) {
	b := newBrowser(t, 1280, 900)
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) { sayInTurn(s, []string{markdownReply}) })
	b.do(
		chromedp.Navigate(ts.url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#input")),
		chromedp.SendKeys(chromedp.CSS("#input"), "how do I build it?\n"),
	)
	content := lastReply + `.querySelector(".content")`
	b.wait("the reply", `!document.querySelector("#messages .message.assistant.streaming") && `+content+`.querySelector("blockquote")`, 10*time.Second)
	for js, want := range map[string]string{
		content + `.querySelector("h2").textContent`:                            "Steps",
		content + `.querySelectorAll("ol > li").length + ""`:                    "2",
		content + `.querySelector("ol strong").textContent`:                     "Go",
		content + `.querySelector("ol em").textContent`:                         "nothing else",
		content + `.querySelector("ol code").textContent`:                       "go build ./cmd/ats",
		content + `.querySelectorAll("ul li.task input[disabled]").length + ""`: "2",
		content + `.querySelector("ul li.task input").checked + ""`:             "true",
		content + `.querySelector(".code-block .code-lang").textContent`:        "go",
		content + `.querySelector(".code-block pre code").textContent`:          "func main() {\n\tprintln(\"a < b && c\")\n}",
		content + `.querySelector("table th:nth-child(2)").style.textAlign`:     "right",
		content + `.querySelector("table td code").textContent`:                 "-n",
		content + `.querySelector("blockquote a").href`:                         "https://example.com/docs",
		content + `.querySelector("blockquote a").rel`:                          "noopener noreferrer nofollow",
		content + `.querySelector("blockquote a").target`:                       "_blank",
		content + `.querySelector("del").textContent`:                           "old",
		content + `.lastElementChild.textContent`:                               "Fish & chips, old new.",
	} {
		if got := evalJS[string](b, js); got != want {
			t.Errorf("%s = %q, want %q", js, got, want)
		}
	}
	// Copy puts the code block's text on the clipboard (the clipboard is
	// stood in for: headless Chromium's needs a permission prompt).
	evalJS[bool](b, `navigator.clipboard.writeText = (t) => { window.copied = t; return Promise.resolve(); }, true`)
	b.do(chromedp.Click(chromedp.CSS(`#messages .message.assistant .code-copy`)))
	b.wait("the copied code", `window.copied === "func main() {\n\tprintln(\"a < b && c\")\n}"`, 5*time.Second)
	b.wait("the button's confirmation", lastReply+`.querySelector(".code-copy").textContent === "Copied"`, 5*time.Second)
	// The reply's own Copy gives its markdown source.
	b.do(chromedp.Click(chromedp.CSS(`#messages .message.assistant .act-copy`)))
	b.wait("the copied reply", `window.copied === `+jsString(markdownReply), 5*time.Second)
	b.screenshot("webui-markdown")
}

// xssReply is a reply that tries every way of getting HTML run or a
// request made; each would set window.xss.
const xssReply = "<think>\n<img src=x onerror=\"window.xss='think'\">\n</think>\n\n" +
	"# Title <img src=x onerror=\"window.xss='heading'\">\n\n" +
	"<script>window.xss='script'</script>\n\n" +
	"<iframe src=\"javascript:window.xss='iframe'\"></iframe>\n\n" +
	"[click me](javascript:window.xss='link') and <a href=\"javascript:window.xss='a'\">a raw link</a>\n\n" +
	"![pic](/ui/from-reply.png) <svg onload=\"window.xss='svg'\"></svg> <style>body{display:none}</style>\n\n" +
	"```html\n</code></pre><img src=x onerror=\"window.xss='code'\">\n```\n\n" +
	"<details open><summary>s</summary><img src=x onerror=\"window.xss='details'\"></details>\n\n" +
	"| a |\n| --- |\n| <img src=x onerror=\"window.xss='cell'\"> |\n\n" +
	"&lt;b&gt;entities&lt;/b&gt; &#60;i&#62;"

// TestWebUISanitised: HTML in a reply, in its reasoning and in the user's
// own message shows as text; nothing in it runs, loads or links anywhere
// but http(s), also when the conversation comes back from localStorage.
func TestWebUISanitised(t *testing.T) {
	b := newBrowser(t, 1280, 900)
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) { sayInTurn(s, []string{xssReply}) })
	// Requests the page makes, to see that no image is fetched.
	var mu sync.Mutex
	var paths []string
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		ts.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	b.do(
		chromedp.Navigate(front.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#input")),
		chromedp.SendKeys(chromedp.CSS("#input"), `<img src=x onerror="window.xss='user'"> hi`+"\n"),
	)
	b.wait("the reply", `!document.querySelector("#messages .message.assistant.streaming") && `+lastReply+`.querySelector("table")`, 10*time.Second)
	check := func(when string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // an onerror would have fired by now
		if got := evalJS[string](b, `String(window.xss)`); got != "undefined" {
			t.Errorf("%s: window.xss = %q: HTML from the conversation ran", when, got)
		}
		live := evalJS[[]string](b, `[...document.querySelectorAll("#messages .content *, #messages .reasoning-text *")].map(e => e.tagName.toLowerCase()).filter(n => ["img","script","iframe","svg","style","details","object","embed","link","meta"].includes(n))`)
		if len(live) != 0 {
			t.Errorf("%s: elements made from the conversation: %v", when, live)
		}
		if hrefs := evalJS[[]string](b, `[...document.querySelectorAll("#messages a")].map(a => a.getAttribute("href"))`); len(hrefs) != 0 {
			t.Errorf("%s: links %v, want none (only http, https and mailto targets become links)", when, hrefs)
		}
		if got := b.text("#messages .message.user .content"); got != `<img src=x onerror="window.xss='user'"> hi` {
			t.Errorf("%s: the user's message shows as %q", when, got)
		}
		reply := evalJS[string](b, lastReply+`.querySelector(".content").textContent`)
		for _, want := range []string{
			`Title <img src=x onerror="window.xss='heading'">`,
			`<script>window.xss='script'</script>`,
			`click me (javascript:window.xss='link')`,
			`<a href="javascript:window.xss='a'">a raw link</a>`,
			`[image: pic /ui/from-reply.png]`,
			`<svg onload="window.xss='svg'"></svg>`,
			`<style>body{display:none}</style>`,
			`<details open><summary>s</summary>`,
			`<img src=x onerror="window.xss='cell'">`,
			`<b>entities</b> <i>`,
		} {
			if !strings.Contains(reply, want) {
				t.Errorf("%s: the reply does not show %q as text; it shows %q", when, want, reply)
			}
		}
		if got := evalJS[string](b, lastReply+`.querySelector(".code-block code").textContent`); got != `</code></pre><img src=x onerror="window.xss='code'">` {
			t.Errorf("%s: code block %q", when, got)
		}
		if got := evalJS[string](b, lastReply+`.querySelector(".reasoning-text").textContent`); !strings.Contains(got, `<img src=x onerror="window.xss='think'">`) {
			t.Errorf("%s: reasoning %q", when, got)
		}
	}
	check("streamed")
	b.do(chromedp.Reload())
	b.wait("the restored conversation", `document.querySelectorAll("#messages .message").length === 2`, 10*time.Second)
	check("restored from localStorage")
	mu.Lock()
	defer mu.Unlock()
	for _, p := range paths {
		if p == "/x" || p == "/ui/from-reply.png" {
			t.Errorf("the page fetched %s, a URL from the reply", p)
		}
	}
}

// TestWebUIRegenerateEdit: Regenerate replaces the last reply with a new
// one for the same conversation; editing a message of the user and
// sending it drops what followed and asks again; both survive a reload.
func TestWebUIRegenerateEdit(t *testing.T) {
	b := newBrowser(t, 1280, 900)
	var prompts func() []string
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) {
		prompts = sayInTurn(s, []string{"First answer.", "Second answer.", "Third answer.", "Fourth answer."})
	})
	b.do(
		chromedp.Navigate(ts.url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#input")),
		chromedp.SendKeys(chromedp.CSS("#input"), "question one\n"),
	)
	idle := `!document.querySelector("#messages .message.streaming") && !document.getElementById("send").hidden`
	b.wait("the first answer", idle+` && `+lastContent+` === "First answer."`, 10*time.Second)

	b.do(chromedp.Click(chromedp.CSS(`#messages .message.assistant:last-child .act-regenerate`)))
	b.wait("the regenerated answer", idle+` && `+lastContent+` === "Second answer."`, 10*time.Second)
	if n := evalJS[int](b, `document.querySelectorAll("#messages .message").length`); n != 2 {
		t.Errorf("%d messages after regenerate, want 2", n)
	}
	if p := prompts(); len(p) != 2 || p[0] != p[1] {
		t.Errorf("regenerate sent another prompt than the first reply's:\n%q", p)
	}

	b.do(chromedp.SendKeys(chromedp.CSS("#input"), "question two\n"))
	b.wait("the third answer", idle+` && `+lastContent+` === "Third answer."`, 10*time.Second)
	if n := evalJS[int](b, `document.querySelectorAll("#messages .act-regenerate").length`); n != 1 {
		t.Errorf("%d regenerate buttons, want 1 (the last reply's)", n)
	}
	if p := prompts(); len(p) != 3 || !containsAll(p[2], "question one", "Second answer.", "question two") || strings.Contains(p[2], "First answer.") {
		t.Errorf("the second turn's prompt %q", p[len(p)-1])
	}

	// Edit the first question and send it again.
	b.do(chromedp.Click(chromedp.CSS(`#messages .message.user[data-index="0"] .act-edit`)))
	b.wait("the edit box", `document.querySelector("#messages .edit-input") !== null`, 5*time.Second)
	if got := evalJS[string](b, `document.querySelector("#messages .edit-input").value`); got != "question one" {
		t.Errorf("the edit box holds %q", got)
	}
	b.do(
		chromedp.SetValue(chromedp.CSS("#messages .edit-input"), "question one, edited"),
		chromedp.Click(chromedp.CSS("#messages .edit-send")),
	)
	b.wait("the answer to the edited question", idle+` && `+lastContent+` === "Fourth answer."`, 10*time.Second)
	got := evalJS[[]string](b, `[...document.querySelectorAll("#messages .message .content")].map(e => e.textContent)`)
	if diff := cmp.Diff([]string{"question one, edited", "Fourth answer."}, got); diff != "" {
		t.Errorf("messages after edit-and-resend (-want +got):\n%s", diff)
	}
	if p := prompts(); len(p) != 4 || !strings.Contains(p[3], "question one, edited") || strings.Contains(p[3], "question two") || strings.Contains(p[3], "answer.") {
		t.Errorf("the edited turn's prompt %q", p[len(p)-1])
	}
	if got := b.text("#conversations li.active"); !strings.Contains(got, "question one, edited") {
		t.Errorf("conversation title %q after editing its first message", got)
	}

	// Cancel leaves a message as it was.
	b.do(chromedp.Click(chromedp.CSS(`#messages .message.user .act-edit`)))
	b.do(chromedp.Click(chromedp.CSS("#messages .edit-cancel")))
	b.wait("the message back", `document.querySelector("#messages .edit-input") === null && document.querySelector("#messages .message.user .content").textContent === "question one, edited"`, 5*time.Second)

	b.do(chromedp.Reload())
	b.wait("the restored conversation", `document.querySelectorAll("#messages .message").length === 2`, 10*time.Second)
	if got := evalJS[string](b, lastContent); got != "Fourth answer." {
		t.Errorf("restored reply %q", got)
	}
}

// TestWebUIMachineFirstState: the machine page shows the server's figures
// and placement map as it loads, from the state in the page, before any
// request of its own has been answered.
func TestWebUIMachineFirstState(t *testing.T) {
	b := newBrowser(t, 1440, 900)
	placement := testPlacementMap(t, qwen3_14B, 6<<30)
	ts := startServer(t, Config{PlacementMap: func() ([]byte, error) { return placement, nil }})
	// The API behind the page answers only once the test is over: what the
	// page shows meanwhile came with the page.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" || r.URL.Path == "/v1/ats/placement" || r.URL.Path == "/v1/models" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		ts.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	b.do(chromedp.Navigate(front.URL + "/machine"))
	b.wait("the map", `document.querySelectorAll("#placement-map .cell").length === 40 * 8`, 5*time.Second)
	for id, want := range map[string]string{
		"model-name":    "tiny",
		"weights-value": "1.71 MiB CPU",
		"context-value": "0 / 256",
		"decode-value":  "no generation yet",
		"vram-value":    "not reported",
	} {
		if got := b.text("#" + id); got != want {
			t.Errorf("#%s = %q, want %q", id, got, want)
		}
	}
	if got := b.text("#metrics-status"); !strings.HasPrefix(got, "Live") {
		t.Errorf("metrics status %q", got)
	}
	if n := evalJS[int](b, `[...document.querySelectorAll(".card .value")].filter(e => e.textContent === "…").length`); n != 0 {
		t.Errorf("%d cards still show …", n)
	}
}

// firstStateOf fetches a page and decodes the state it carries.
func firstStateOf(t *testing.T, url string) (firstState, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?s)<script type="application/json" id="first-state">(.*?)</script>`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("%s carries no first state", url)
	}
	var st firstState
	if err := json.Unmarshal(m[1], &st); err != nil {
		t.Fatalf("%s: first state %q: %v", url, m[1], err)
	}
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("%s: Cache-Control %q, want no-store for a page with the server's state", url, resp.Header.Get("Cache-Control"))
	}
	return st, string(body)
}

// TestWebUIFirstStateServed: what the pages carry, without a browser: the
// metrics and the map without a key, only the model's name with one, and
// nothing in the state can close its script element.
func TestWebUIFirstStateServed(t *testing.T) {
	hostile := []byte(`{"model": "</script><script>window.xss=1</script>", "units": []}`)
	ts := startServer(t, Config{PlacementMap: func() ([]byte, error) { return hostile, nil }})
	st, body := firstStateOf(t, ts.url+"/machine")
	if st.Model != "tiny" || st.KeyNeed || !strings.Contains(st.Metrics, "ats_context_size 256") {
		t.Errorf("machine page state: model %q, key needed %v, metrics %d bytes", st.Model, st.KeyNeed, len(st.Metrics))
	}
	var p map[string]any
	if err := json.Unmarshal(st.Placement, &p); err != nil || p["model"] != "</script><script>window.xss=1</script>" {
		t.Errorf("placement %s (%v)", st.Placement, err)
	}
	if strings.Count(body, "</script>") != 2 { // the state's and the module's
		t.Errorf("the page has %d </script>, want 2: the state closed its element", strings.Count(body, "</script>"))
	}
	chat, _ := firstStateOf(t, ts.url+"/")
	if diff := cmp.Diff(firstState{Model: "tiny"}, chat); diff != "" {
		t.Errorf("chat page state (-want +got):\n%s", diff)
	}

	keyed := startServer(t, Config{APIKey: "k", PlacementMap: func() ([]byte, error) { return hostile, nil }})
	st, _ = firstStateOf(t, keyed.url+"/machine")
	if diff := cmp.Diff(firstState{Model: "tiny", KeyNeed: true}, st); diff != "" {
		t.Errorf("with an API key the page carries only (-want +got):\n%s", diff)
	}

	cpuOnly := startServer(t, Config{})
	st, _ = firstStateOf(t, cpuOnly.url+"/machine")
	if st.Placement != nil || st.PlacementStatus != http.StatusNotFound {
		t.Errorf("CPU only: placement %s, status %d", st.Placement, st.PlacementStatus)
	}
}
