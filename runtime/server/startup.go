package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
)

// Starting serves a listener while the model loads, so that the port is
// taken (and a busy one reported) before a load of minutes, and so that
// clients and load balancers can tell "loading" from "down": /health
// answers 503 {"status": "loading"} and every other request a 503 error,
// until Ready hands the listener to the Server. llama.cpp's server does
// the same.
type Starting struct {
	cfg    Config
	hosts  *HostPolicy
	hs     *http.Server
	srv    atomic.Pointer[Server]
	served chan error
}

// Listen starts serving ln at once. cfg supplies the timeouts, the log and
// the model name; the Server given to Ready should have the same.
func Listen(ln net.Listener, cfg Config) *Starting {
	cfg.setDefaults()
	st := &Starting{cfg: cfg, served: make(chan error, 1)}
	// Not answering other Hosts while loading either; a bad list is
	// New's error to report, meanwhile only the default hosts pass.
	if st.hosts, _ = ParseAllowedHosts(cfg.AllowedHosts); st.hosts == nil {
		st.hosts, _ = ParseAllowedHosts(nil)
	}
	st.hs = newHTTPServer(http.HandlerFunc(st.serveHTTP), &st.cfg)
	go func() {
		err := st.hs.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		st.served <- err
	}()
	return st
}

func (st *Starting) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if s := st.srv.Load(); s != nil {
		s.handler.ServeHTTP(w, r)
		return
	}
	if !st.hosts.allowsHost(r) {
		w.Header().Set("Connection", "close")
		writeError(w, withCode(&apiError{Status: http.StatusForbidden, Type: typePermission,
			Message: fmt.Sprintf("the Host %q is not one this server answers to (--allowed-hosts)", r.Host)}, "host_not_allowed"))
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/v1")
	if path == "/health" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "loading", "model": st.cfg.ModelName}, st.cfg.WriteTimeout)
		return
	}
	writeError(w, withCode(&apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable,
		Message: "the model is still loading; try again shortly (GET /health answers 200 once it is ready)"}, "model_loading"))
}

// Ready hands the listener to s: from now on s answers every request, and
// s.Shutdown stops the listener.
func (st *Starting) Ready(s *Server) error {
	if err := s.attach(st.hs); err != nil {
		return err
	}
	st.srv.Store(s)
	return nil
}

// Served delivers the listener's end: nil after a shutdown, else why it
// stopped serving.
func (st *Starting) Served() <-chan error { return st.served }

// Close stops the listener of a server that never became ready (its model
// failed to load).
func (st *Starting) Close() error {
	if st.srv.Load() != nil {
		return errors.New("server: Close of a started server; use Server.Shutdown")
	}
	return st.hs.Close()
}
