package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The web UI in a real browser: Chromium, headless, driven over the
// DevTools protocol against a loopback server on the tiny oracle model. The
// tests skip, saying why, where no Chromium is installed (.ci/run installs
// Debian's). With ATS_WEBUI_SCREENSHOTS=DIR they also save the screenshots
// the README shows.

// findBrowser returns a Chromium or Chrome to drive, or skips.
func findBrowser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ATS_BROWSER"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium or Chrome found (install Debian's chromium, or set ATS_BROWSER to a browser binary): the web UI is not tested in a browser")
	return ""
}

// newBrowser starts a headless browser with a fresh profile and returns a
// context for one tab. The flags keep Chromium off the network (it would
// otherwise call Google's services at start).
func newBrowser(t *testing.T, width, height int, extra ...chromedp.ExecAllocatorOption) *tab {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(findBrowser(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	opts = append(opts, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	tabCtx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	if err := chromedp.Do(tabCtx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("starting the browser: %v", err)
	}
	return &tab{t: t, ctx: tabCtx}
}

// tab is a browser tab under test.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

// evalJS evaluates a JavaScript expression in the tab.
func evalJS[T any](b *tab, js string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("%s: %v", js, err)
	}
	return v
}

// wait polls a JavaScript condition until it holds.
func (b *tab) wait(what, js string, timeout time.Duration) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](js,
		chromedp.WithPollingInterval(25*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		b.t.Fatalf("waiting for %s (%s): %v", what, js, err)
	}
}

// text is the text of the first element css selects ("" if none).
func (b *tab) text(css string) string {
	b.t.Helper()
	return evalJS[string](b, `(document.querySelector(`+jsString(css)+`) || {}).textContent || ""`)
}

func jsString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// screenshot saves the page as NAME.png under $ATS_WEBUI_SCREENSHOTS.
func (b *tab) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("ATS_WEBUI_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("saved %s.png (%d bytes)", name, len(png))
}

const (
	lastReply   = `document.querySelector("#messages .message.assistant:last-child")`
	lastContent = lastReply + `.querySelector(".content").textContent`
	lastMeta    = lastReply + `.querySelector(".meta").textContent`
)

// TestWebUIChat sends messages from the chat page to the tiny oracle
// model: a short reply streams in and ends with its statistics; a long
// one is stopped with the stop button, which ends the generation on the
// server; the conversation survives a reload.
func TestWebUIChat(t *testing.T) {
	b := newBrowser(t, 1280, 800)
	// 5 ms per token: a long reply takes seconds, time enough to watch it
	// stream and stop it.
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) {
		s.testHookToken = func() { time.Sleep(5 * time.Millisecond) }
	})
	// The made-up vocabulary's end tokens are banned through the page's
	// extra request fields, so replies run to their length.
	custom, err := json.Marshal(map[string]any{"logit_bias": ts.noEOG(), "seed": 7})
	if err != nil {
		t.Fatal(err)
	}

	b.do(chromedp.Navigate(ts.url + "/"))
	b.wait("the model name", `document.getElementById("model-name").textContent === "tiny"`, 10*time.Second)
	if got := b.text("#empty h1"); !strings.Contains(got, "Chat") {
		t.Errorf("empty page heading %q", got)
	}
	// The server's defaults (from /props) show as placeholders.
	b.wait("the default temperature", `document.getElementById("set-temperature").placeholder === "0.8"`, 5*time.Second)

	// Settings typed into the form are kept in localStorage.
	b.do(
		chromedp.SendKeys(chromedp.CSS("#set-max_tokens"), "12"),
		chromedp.SetValue(chromedp.CSS("#set-custom"), string(custom)),
		chromedp.Click(chromedp.CSS("#set-system")), // blur: change events
	)
	evalJS[bool](b, `document.getElementById("set-custom").dispatchEvent(new Event("input")), true`)
	b.wait("the settings saved", `(JSON.parse(localStorage.getItem("ats.settings") || "{}").max_tokens === 12) && JSON.parse(localStorage.getItem("ats.settings")).custom.includes("logit_bias")`, 5*time.Second)

	// A short reply: streams in, then shows its statistics.
	b.do(
		chromedp.SendKeys(chromedp.CSS("#input"), "hello there"),
		chromedp.Click(chromedp.CSS("#send")),
	)
	b.wait("the reply's statistics", lastMeta+`.includes("12 tokens")`, 20*time.Second)
	if c := evalJS[string](b, lastContent); c == "" {
		t.Error("the reply is empty")
	}
	if got := evalJS[string](b, `document.querySelector("#messages .message.user").textContent`); !strings.Contains(got, "hello there") {
		t.Errorf("user message %q", got)
	}
	if got := b.text("#conversations li.active"); !strings.Contains(got, "hello there") {
		t.Errorf("conversation title %q", got)
	}
	b.screenshot("webui-chat")

	// A long reply: watch it grow, then stop it.
	b.do(
		chromedp.SetValue(chromedp.CSS("#set-max_tokens"), ""),
		chromedp.Click(chromedp.CSS("#set-system")),
	)
	evalJS[bool](b, `document.getElementById("set-max_tokens").dispatchEvent(new Event("change")), true`)
	cancelledBefore := ts.metric(t, "ats_generations_cancelled_total")
	b.do(
		chromedp.SendKeys(chromedp.CSS("#input"), "and now a long one"),
		chromedp.Click(chromedp.CSS("#send")),
	)
	b.wait("the stop button", `!document.getElementById("stop").hidden && document.getElementById("send").hidden`, 5*time.Second)
	b.wait("streamed text", lastContent+`.length > 20`, 20*time.Second)
	n1 := len(evalJS[string](b, lastContent))
	b.wait("more streamed text", lastContent+`.length > `+strconv.Itoa(n1+20), 20*time.Second)
	if evalJS[bool](b, lastReply+`.classList.contains("streaming")`) != true {
		t.Error("the reply does not show that it is streaming")
	}
	b.do(chromedp.Click(chromedp.CSS("#stop")))
	b.wait("the stopped reply", lastMeta+`.includes("stopped") && document.getElementById("stop").hidden && !document.getElementById("send").hidden`, 10*time.Second)
	stoppedAt := evalJS[string](b, lastContent)
	// The server saw the client leave and stopped generating.
	deadline := time.Now().Add(10 * time.Second)
	for ts.metric(t, "ats_generations_cancelled_total") <= cancelledBefore {
		if time.Now().After(deadline) {
			t.Fatal("the server did not stop the generation after the stop button")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if now := evalJS[string](b, lastContent); now != stoppedAt {
		t.Errorf("the reply grew after stop: %d then %d characters", len(stoppedAt), len(now))
	}

	// The conversation is kept in the browser.
	b.do(chromedp.Reload())
	b.wait("the restored conversation", `document.querySelectorAll("#messages .message").length === 4`, 10*time.Second)
	if got := evalJS[string](b, lastMeta); !strings.Contains(got, "stopped") {
		t.Errorf("restored stopped reply meta %q", got)
	}
	if got := evalJS[int](b, `JSON.parse(localStorage.getItem("ats.conversations")).length`); got != 1 {
		t.Errorf("%d conversations stored, want 1", got)
	}

	// New chat, then delete the old one.
	b.do(chromedp.Click(chromedp.CSS("#new-chat")))
	b.wait("an empty chat", `document.querySelectorAll("#messages .message").length === 0 && !document.getElementById("empty").hidden`, 5*time.Second)
	b.do(chromedp.Click(chromedp.CSS(`#conversations li:not(.active) .conv-delete`)))
	b.wait("the deleted conversation gone", `document.querySelectorAll("#conversations li").length === 1`, 5*time.Second)
}

// TestWebUIReasoningFolded: a reply with reasoning shows it folded away,
// apart from the answer.
func TestWebUIReasoningFolded(t *testing.T) {
	b := newBrowser(t, 1280, 800)
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) {
		say(s, "<think>\nThe user greets me; a greeting back fits.\n</think>\n\nHello! How can I help?", nil)
	})
	b.do(
		chromedp.Navigate(ts.url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#input")),
		chromedp.SendKeys(chromedp.CSS("#input"), "hi\n"), // Enter sends
	)
	b.wait("the answer", lastContent+` === "Hello! How can I help?"`, 10*time.Second)
	details := lastReply + `.querySelector("details.reasoning")`
	if evalJS[bool](b, details+`.hidden || `+details+`.open`) {
		t.Error("the reasoning is hidden or unfolded; want it shown folded")
	}
	if got := evalJS[string](b, details+`.querySelector(".reasoning-text").textContent`); !strings.Contains(got, "a greeting back fits") {
		t.Errorf("reasoning text %q", got)
	}
	if got := evalJS[string](b, details+`.querySelector("summary").textContent`); got != "Reasoning" {
		t.Errorf("summary %q after the reply", got)
	}
}

// TestWebUIAPIKey: with --api-key the pages load, say the key is needed,
// and work once it is set in the settings.
func TestWebUIAPIKey(t *testing.T) {
	b := newBrowser(t, 1280, 800)
	ts := startServerCtx(t, 1024, Config{APIKey: "sekrit"}, func(s *Server) { say(s, "Fine, thanks.", nil) })
	b.do(chromedp.Navigate(ts.url + "/"))
	b.wait("the key notice", `document.getElementById("model-name").textContent === "API key needed"`, 10*time.Second)
	b.do(
		chromedp.SendKeys(chromedp.CSS("#input"), "how are you?"),
		chromedp.Click(chromedp.CSS("#send")),
	)
	b.wait("the 401 in the reply", lastMeta+`.includes("API key")`, 10*time.Second)
	b.do(
		chromedp.SendKeys(chromedp.CSS("#set-apikey"), "sekrit"),
		chromedp.Click(chromedp.CSS("#set-system")),
		chromedp.SendKeys(chromedp.CSS("#input"), "and now?"),
		chromedp.Click(chromedp.CSS("#send")),
	)
	b.wait("the answer", lastContent+` === "Fine, thanks."`, 10*time.Second)

	// The machine page without the key: everything "not reported".
	evalJS[bool](b, `localStorage.removeItem("ats.apiKey"), true`)
	b.do(chromedp.Navigate(ts.url + "/machine"))
	b.wait("the metrics error", `document.getElementById("metrics-status").textContent.includes("not reported")`, 10*time.Second)
	for _, id := range []string{"vram-value", "decode-value", "link-value", "promo-value", "weights-value", "context-value"} {
		if got := b.text("#" + id); got != "not reported" {
			t.Errorf("#%s = %q without the key, want \"not reported\"", id, got)
		}
	}
	if got := b.text("#placement-status"); !strings.Contains(got, "API key") {
		t.Errorf("placement status %q", got)
	}
}

// TestWebUIMachine shows a placement map from a provider, the live
// figures /metrics has, "not reported" for those it lacks, and the figures
// the lead's engine will add once they appear.
func TestWebUIMachine(t *testing.T) {
	b := newBrowser(t, 1440, 900)
	placement := testPlacementMap(t, qwen3_14B, 6<<30)
	var extra atomic.Value // series appended to /metrics
	extra.Store("")
	ts := startServer(t, Config{PlacementMap: func() ([]byte, error) { return placement, nil }})
	// A front server adds series to /metrics, standing in for the
	// engine's VRAM and link figures.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		more := extra.Load().(string)
		if r.URL.Path != "/metrics" || more == "" {
			ts.Handler().ServeHTTP(w, r)
			return
		}
		r.Header.Del("Accept-Encoding") // plain text, to append to
		rec := httptest.NewRecorder()
		ts.Handler().ServeHTTP(rec, r)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(rec.Body.Bytes())
		w.Write([]byte(more))
	}))
	t.Cleanup(front.Close)

	b.do(chromedp.Navigate(front.URL + "/machine"))
	b.wait("the map", `document.querySelectorAll("#placement-map .cell").length === 40 * 8`, 10*time.Second)
	gpu := evalJS[int](b, `document.querySelectorAll('#placement-map .cell[data-backend="gpu"]').length`)
	cpu := evalJS[int](b, `document.querySelectorAll('#placement-map .cell[data-backend="cpu"]').length`)
	if gpu == 0 || cpu == 0 || gpu+cpu != 320 {
		t.Errorf("cells: %d on the GPU, %d on the CPU; want a split of 320", gpu, cpu)
	}
	rows := evalJS[[]string](b, `[...document.querySelectorAll("#placement-map .row-head")].map(e => e.textContent)`)
	if want := []string{"attn_q", "attn_k", "attn_v", "attention", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}; strings.Join(rows, ",") != strings.Join(want, ",") {
		t.Errorf("rows %v, want %v", rows, want)
	}
	if got := evalJS[string](b, `[...document.querySelectorAll("#placement-outside .chip")].map(e => e.dataset.role).join(",")`); got != "token_embd,output" {
		t.Errorf("units outside the blocks: %q", got)
	}
	if got := b.text("#placement-summary"); !containsAll(got, "qwen3-14b-q4_k_m.gguf", "VRAM budget6.00 GiB", "Predicted decode") {
		t.Errorf("summary %q", got)
	}
	// Pointing at a cell names its tensor.
	b.do(chromedp.Click(chromedp.CSS(`#placement-map .cell[data-layer="3"][data-role="ffn_down"]`)))
	if got := b.text("#cell-info"); !containsAll(got, "blk.3.ffn_down.weight", "Q6_K", "MiB") {
		t.Errorf("cell info %q", got)
	}

	// Live figures: what the server reports now, "not reported" for the rest.
	b.wait("the metrics", `document.getElementById("metrics-status").textContent.startsWith("Live")`, 10*time.Second)
	for id, want := range map[string]string{
		"vram-value":    "not reported",
		"link-value":    "not reported",
		"decode-value":  "no generation yet",
		"weights-value": "1.71 MiB CPU",
		"promo-value":   "0 B",
		"context-value": "0 / 256",
	} {
		if got := b.text("#" + id); got != want {
			t.Errorf("#%s = %q, want %q", id, got, want)
		}
	}
	if got := b.text("#vram-sub"); got != "budget 6.00 GiB (from the plan)" {
		t.Errorf("vram sub %q", got)
	}

	// A generation updates the speed; the engine's figures show once reported.
	if _, err := ts.client.Chat.Completions.New(context.Background(), ts.chatParams("hi", 8)); err != nil {
		t.Fatal(err)
	}
	extra.Store("ats_vram_used_bytes 5.0e+09\nats_vram_budget_bytes 6442450944\nats_link_bytes_per_second 2.6e+10\n" +
		"ats_promoted_bytes 1.2e+08\nats_replans_total 0\n" +
		`ats_gpu_memory_used_bytes{gpu="0",name="NVIDIA H200"} 6.1e+09` + "\n" +
		`ats_gpu_memory_total_bytes{gpu="0",name="NVIDIA H200"} 1.5e+11` + "\n" +
		`ats_gpu_utilization_ratio{gpu="0",name="NVIDIA H200"} 0.42` + "\n")
	b.wait("the engine's figures", `document.getElementById("vram-value").textContent === "4.66 GiB"`, 10*time.Second)
	b.wait("the decode speed", `document.getElementById("decode-value").textContent.endsWith("tok/s")`, 10*time.Second)
	for id, want := range map[string]string{
		"link-value":  "24.2 GiB/s",
		"promo-value": "114.4 MiB",
		"vram-sub":    "budget 6.00 GiB",
		"gpu-list":    "GPU 0 NVIDIA H200: 5.68 GiB of 139.7 GiB in use, 42% busy",
	} {
		if got := b.text("#" + id); got != want {
			t.Errorf("#%s = %q, want %q", id, got, want)
		}
	}
	if w := evalJS[string](b, `document.getElementById("vram-bar").style.width`); w != "77.6%" {
		t.Errorf("VRAM bar width %q", w)
	}
	evalJS[bool](b, `document.activeElement.blur(), true`)
	b.screenshot("webui-machine")

	// CPU only: no map, said plainly.
	cpuOnly := startServer(t, Config{})
	b.do(chromedp.Navigate(cpuOnly.url + "/machine"))
	b.wait("the CPU-only note", `document.getElementById("placement-status").textContent.includes("CPU only")`, 10*time.Second)
	if n := evalJS[int](b, `document.querySelectorAll("#placement-map .cell").length`); n != 0 {
		t.Errorf("%d cells without a placement map", n)
	}
	if evalJS[bool](b, `!document.querySelector(".legend").hidden`) {
		t.Error("the legend shows without a map")
	}
}

// TestWebUIMachineRouted: a placement whose decode steps route CPU MoE
// layers (Placement.Routed) says so in the machine page's summary.
func TestWebUIMachineRouted(t *testing.T) {
	b := newBrowser(t, 1440, 900)
	var pl map[string]any
	if err := json.Unmarshal(testPlacementMap(t, qwen3_14B, 6<<30), &pl); err != nil {
		t.Fatal(err)
	}
	// Three of the CPU's units stand for routed MoE layers (the dense test
	// model has none): the page marks exactly their cells.
	var routed []string
	for _, u := range pl["units"].([]any) {
		u := u.(map[string]any)
		if u["backend"] == "cpu" && u["role"] == "ffn_down" && len(routed) < 3 {
			routed = append(routed, u["name"].(string))
		}
	}
	if len(routed) != 3 {
		t.Fatalf("the test placement has %d CPU ffn_down units, want 3 or more", len(routed))
	}
	// showMap serves pl and opens the machine page on it.
	showMap := func() {
		placement, err := json.Marshal(pl)
		if err != nil {
			t.Fatal(err)
		}
		ts := startServer(t, Config{PlacementMap: func() ([]byte, error) { return placement, nil }})
		b.do(chromedp.Navigate(ts.url + "/machine"))
		b.wait("the map", `document.querySelectorAll("#placement-map .cell").length > 0`, 10*time.Second)
	}
	pl["routed"], pl["routed_share"], pl["routed_experts"] = routed, 0.375, 12
	showMap()
	if got := b.text("#placement-summary"); !containsAll(got, "MoE layers routed at decode", "3: the GPU takes 38% of the chosen experts, up to 12 a layer") {
		t.Errorf("summary %q", got)
	}
	marked := evalJS[[]string](b, `[...document.querySelectorAll("#placement-map .cell.routed")].map((c) => c.title.split(":")[0])`)
	if !slices.Equal(marked, routed) {
		t.Errorf("cells marked routed: %q, want %q", marked, routed)
	}
	if n := evalJS[int](b, `document.querySelectorAll("#placement-map .cell[data-routed]").length`); n != 3 {
		t.Errorf("%d cells with data-routed, want 3", n)
	}
	if !evalJS[bool](b, `!document.getElementById("legend-routed").hidden`) {
		t.Error("the legend does not show the routed swatch")
	}
	if got := b.text("#placement-map .cell.routed"); got != "" {
		t.Errorf("a routed cell has text %q", got)
	}
	if title := evalJS[string](b, `document.querySelector("#placement-map .cell.routed").title`); !strings.Contains(title, "routed: at decode the GPU takes a share") {
		t.Errorf("a routed cell's title %q does not say so", title)
	}
	if bg := evalJS[string](b, `getComputedStyle(document.querySelector("#placement-map .cell.routed")).backgroundImage`); !strings.Contains(bg, "repeating-linear-gradient") {
		t.Errorf("a routed cell's background %q is not striped", bg)
	}

	// Without routed layers the swatch stays hidden.
	delete(pl, "routed")
	showMap()
	if !evalJS[bool](b, `document.getElementById("legend-routed").hidden && !document.querySelector("#placement-map .cell.routed")`) {
		t.Error("a placement without routed layers shows the routed swatch or marks cells")
	}
}
