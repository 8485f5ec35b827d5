package server

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
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

// serveWebUI writes a web UI file; the ETag (a hash of the file) lets a
// browser revalidate its copy instead of downloading it again.
func (s *Server) serveWebUI(w http.ResponseWriter, r *http.Request, a *webAsset) {
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if strings.HasPrefix(a.ctype, "text/html") {
		h.Set("Content-Security-Policy", contentSecurityPolicy)
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(a.body))
}
