package server

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
)

// The web UI is plain HTML, CSS and JavaScript modules compiled into the
// binary: GET / is the chat page, GET /machine the machine page, and
// /ui/ holds what they load. The pages call the same API as any client
// (/v1/chat/completions streamed, /metrics, /v1/ats/placement, /props),
// so they are served without the API key and ask for it when the API does.
//
//go:embed webui
var webUIFS embed.FS

// webAsset is one file of the web UI, ready to serve.
type webAsset struct {
	name  string
	body  []byte
	ctype string
	etag  string
	page  string // "chat" or "machine" for the pages, which carry the server's first state
}

// webUI maps request paths to the web UI's files.
var webUI = loadWebUI()

func loadWebUI() map[string]*webAsset {
	assets := map[string]*webAsset{}
	err := fs.WalkDir(webUIFS, "webui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := webUIFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		rel := strings.TrimPrefix(p, "webui/")
		assets["/ui/"+rel] = &webAsset{name: rel, body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		// The files are compiled in: a failure here is a broken build.
		panic("server: reading the embedded web UI: " + err.Error())
	}
	assets["/ui/index.html"].page = "chat"
	assets["/ui/machine.html"].page = "machine"
	assets["/"] = assets["/ui/index.html"]
	assets["/machine"] = assets["/ui/machine.html"]
	return assets
}

// webUIRoute finds the web UI file for a request path.
func webUIRoute(p string) (*webAsset, bool) {
	a, ok := webUI[p]
	return a, ok && a != nil
}

// contentSecurityPolicy keeps the pages to their own scripts and styles
// and to this server: text a model writes is only ever shown as text, and
// this rules out the rest should that ever slip.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// firstStateElement is the element of a page that the server fills with
// its first state (a JSON document the page's script reads; the browser
// does not run it).
const firstStateElement = `<script type="application/json" id="first-state">{}</script>`

// firstState is what a page renders before it has asked the server
// anything: the model's name (public, as in /health), and on the machine
// page the metrics and the placement map, so that the cards and the map
// show real figures at once instead of placeholders until the first poll.
// With an API key the metrics and the map stay out of the page (it is
// served without the key) and the page fetches them with its own.
type firstState struct {
	Model   string `json:"model"`
	KeyNeed bool   `json:"key_needed,omitempty"`
	// Metrics is /metrics's text.
	Metrics string `json:"metrics,omitempty"`
	// Placement is /v1/ats/placement's body, or its error's status and
	// message (404: the model runs on the CPU only).
	Placement        json.RawMessage `json:"placement,omitempty"`
	PlacementStatus  int             `json:"placement_status,omitempty"`
	PlacementMessage string          `json:"placement_message,omitempty"`
}

// pageState is the first state of page ("chat" or "machine").
func (s *Server) pageState(page string) firstState {
	st := firstState{Model: s.cfg.ModelName, KeyNeed: s.cfg.APIKey != ""}
	if page != "machine" || st.KeyNeed {
		return st
	}
	if mfs, err := s.met.reg.Gather(); err == nil {
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if enc.Encode(mf) != nil {
				break
			}
		}
		st.Metrics = buf.String()
	}
	switch {
	case s.cfg.PlacementMap == nil:
		st.PlacementStatus, st.PlacementMessage = http.StatusNotFound, "this server has no placement map: the model runs without a CPU+GPU plan (CPU only)"
	default:
		b, err := s.cfg.PlacementMap()
		switch {
		case err != nil:
			st.PlacementStatus, st.PlacementMessage = http.StatusInternalServerError, "placement map: "+err.Error()
		case !json.Valid(b):
			st.PlacementStatus, st.PlacementMessage = http.StatusInternalServerError, "placement map: the producer gave bytes that are not JSON"
		default:
			st.Placement = b
		}
	}
	return st
}

// serveWebUI writes a web UI file; the ETag (a hash of the file) lets a
// browser revalidate its copy instead of downloading it again. The pages
// carry the server's state of the moment, so they are not cached.
func (s *Server) serveWebUI(w http.ResponseWriter, r *http.Request, a *webAsset) {
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if strings.HasPrefix(a.ctype, "text/html") {
		h.Set("Content-Security-Policy", contentSecurityPolicy)
	}
	body := a.body
	if a.page != "" {
		h.Set("Cache-Control", "no-store")
		// json.Marshal writes <, > and & as \u escapes, so no text in the
		// state can end the script element.
		js, err := json.Marshal(s.pageState(a.page))
		if err != nil {
			writeError(w, internalError(err))
			return
		}
		body = bytes.Replace(body, []byte(firstStateElement),
			[]byte(`<script type="application/json" id="first-state">`+string(js)+`</script>`), 1)
	} else {
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", "no-cache")
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(body))
}
