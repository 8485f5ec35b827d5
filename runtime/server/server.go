// Package server serves a model over HTTP with OpenAI's API:
// /v1/chat/completions (streamed as server-sent events or not),
// /v1/completions, /v1/models, plus /health and Prometheus /metrics.
//
// One model, one Session: requests take turns through a queue with a
// limit (503 beyond it), and since a Session keeps the KV cache of the
// previous request, a request that extends the previous conversation only
// evaluates its new tokens. Replies of reasoning models are split into
// reasoning_content and content, and tool calls are parsed from the text
// in the format of the model's family (see Parse).
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

// Config configures a Server. The zero value works (with the defaults
// below) except where noted.
type Config struct {
	// ModelName is the model's id in /v1/models and in responses
	// (default: the file name without .gguf).
	ModelName string
	// APIKey, when set, must come with every request but /health, as
	// "Authorization: Bearer KEY".
	APIKey string
	// Parallel is how many requests run at once, batched in every step
	// (the scheduler's slots; llama-server's --parallel). 0 means 1.
	Parallel int
	// QueueLimit is how many requests may wait while every slot runs
	// one; more get 503. 0 accepts a request only when a slot is free.
	QueueLimit int
	// Sampling holds the defaults for fields a request leaves out (zero:
	// sampler.DefaultConfig()).
	Sampling *sampler.Config
	// MaxBodyBytes bounds a request body (default 8 MiB).
	MaxBodyBytes int64
	// ReadHeaderTimeout and ReadTimeout bound reading a request's headers
	// and its body (defaults 10 s and 60 s); WriteTimeout bounds each write
	// of a response, so a client that stops reading cannot hold the model
	// (default 60 s); IdleTimeout closes idle keep-alive connections
	// (default 120 s).
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// Placement and GPUStats feed the placement and GPU series of
	// /metrics; they are called at scrape time. Placement defaults to
	// the session's backend; GPUStats to none (serve passes NVML's).
	Placement func() Placement
	GPUStats  func() []GPUStat
	// PlacementMap gives the JSON placement map of GET /v1/ats/placement
	// (the shape `ats plan --json` prints); nil: the endpoint answers 404,
	// as for a model run wholly on the CPU.
	PlacementMap func() ([]byte, error)
	// CORS says which other origins' web pages may call the API (nil:
	// ParseCORS(DefaultCORS), pages on localhost).
	CORS *CORSPolicy
	// AllowedHosts are the Host names the server answers besides
	// localhost, loopback addresses and the address a connection reached
	// (ParseAllowedHosts' syntax; hosts.go): other Hosts get 403, which
	// stops DNS rebinding.
	AllowedHosts []string
	// MaxBodiesBytes bounds the request bodies held at once, over all
	// connections (default 64 MiB, at least MaxBodyBytes); past it a
	// request gets 503 (body.go).
	MaxBodiesBytes int64
	// PProf serves Go's profiles under /debug/pprof/ (off by default: they
	// reveal the process's internals and cost CPU while taken).
	PProf bool
	// Log receives a line per request and the server's notes (default:
	// discard).
	Log *slog.Logger
	// Embeddings serves /v1/embeddings and ollama's /api/embed (llama-server's
	// --embeddings); without it they answer that the server was started
	// without.
	Embeddings bool
	// Pooling overrides the model file's pooling for embeddings (mean,
	// cls, last; "": the file's).
	Pooling string
	// Models describes the served model for ollama's /api/tags, /api/show
	// and /api/ps (nil: what the file says).
	Models *ModelInfo
}

// setDefaults fills in the timeouts, the body limit and the log.
func (cfg *Config) setDefaults() {
	setDefault := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	setDefault(&cfg.ReadHeaderTimeout, 10*time.Second)
	setDefault(&cfg.ReadTimeout, 60*time.Second)
	setDefault(&cfg.WriteTimeout, 60*time.Second)
	setDefault(&cfg.IdleTimeout, 120*time.Second)
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.MaxBodiesBytes <= 0 {
		cfg.MaxBodiesBytes = 64 << 20
	}
	cfg.MaxBodiesBytes = max(cfg.MaxBodiesBytes, cfg.MaxBodyBytes)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// MaxParallel is the most requests a server runs at once: a step returns
// the logits of at most this many rows.
const MaxParallel = executor.MaxLogitRows

// Server is an OpenAI-compatible HTTP server for one Session.
type Server struct {
	cfg     Config
	sess    *session.Session
	tmpl    *chat.Template
	format  ToolFormat
	nVocab  int
	created int64
	fp      string // system_fingerprint

	q       *queue
	sched   *session.Scheduler // runs the requests, batched; the only user of the engine
	prep    *preparation       // admitted requests' rendering and tokenizing (limits.go)
	met     *metrics
	cors    *CORSPolicy
	hosts   *HostPolicy
	bodies  *bodyBudget // request bodies in memory (body.go)
	handler http.Handler

	structured structuredCache // response_format and forced tool calls (structured.go)
	responses  responseStore   // stored responses for previous_response_id (responses.go)
	pooling    session.Pooling // embeddings' pooling (embeddings.go)

	// base ends every generation's context (see generate): cancelling it
	// stops them all (shutdown past its grace period). It is not the
	// requests' own parent, so a request cancelled this way can still be
	// answered (503) before its connection closes.
	base      context.Context
	cancelAll context.CancelFunc
	shutting  atomic.Bool

	fileErr atomic.Pointer[apiError] // set once the model file changed on disk (modelfile.go)

	mu      sync.Mutex
	httpSrv *http.Server

	// gen is the session's Generate; tests replace it to make the model
	// say something in particular (a tool call, reasoning).
	gen func(context.Context, []int, session.GenerateOptions) (*session.GenerateResult, error)
	// testHookToken, when set, runs in the scheduler's step after each
	// sampled token; tests use it to slow generation down or watch it.
	testHookToken func()
	// testHookPrompt, when set, sees each rendered chat prompt.
	testHookPrompt func(string)
}

// New makes a server for sess, which it owns from now on: nothing else
// may use the session until Close. It loads the chat template now, so a
// model without a usable one fails here rather than on the first request.
func New(sess *session.Session, cfg Config) (*Server, error) {
	if cfg.ModelName == "" {
		cfg.ModelName = strings.TrimSuffix(filepath.Base(sess.Model.File.Path), ".gguf")
	}
	if cfg.QueueLimit < 0 {
		return nil, fmt.Errorf("server: queue limit %d is negative", cfg.QueueLimit)
	}
	if cfg.Parallel == 0 {
		cfg.Parallel = 1
	}
	if cfg.Parallel < 0 || cfg.Parallel > MaxParallel {
		return nil, fmt.Errorf("server: %d parallel requests: want 1 to %d", cfg.Parallel, MaxParallel)
	}
	cfg.setDefaults() // cfg.Log among them, used from here on
	if cfg.Parallel > 1 && !sess.MultiSequence() {
		// The requests still take turns step by step, one sequence a step.
		cfg.Log.Warn("the backend computes one sequence a step: parallel requests interleave instead of batching", "parallel", cfg.Parallel)
	}
	def := sampler.DefaultConfig()
	if cfg.Sampling != nil {
		def = *cfg.Sampling
	}
	cfg.Sampling = &def
	if cfg.Placement == nil {
		cfg.Placement = SessionPlacement(sess)
	}
	if cfg.CORS == nil {
		p, err := ParseCORS(DefaultCORS)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		cfg.CORS = p
	}
	hosts, err := ParseAllowedHosts(cfg.AllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	nVocab := sess.Model.Hyper().NVocab
	if _, err := sampler.New(def, nVocab); err != nil {
		return nil, fmt.Errorf("server: default sampling: %w", err)
	}
	// Rendering a conversation loads the template (and reports a fallback
	// through the session's warn function).
	if _, err := sess.RenderChat([]chat.Message{{Role: "user", Content: "hi"}}, chat.Options{AddGenerationPrompt: true}); err != nil {
		return nil, fmt.Errorf("server: chat template: %w", err)
	}
	pooling, err := resolvePooling(cfg.Pooling, sess.Model)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if cfg.Embeddings && pooling == session.PoolingLast && !(sess.Tok.AddEOS() && sess.Tok.EOS() >= 0) {
		// llama.cpp warns the same: a last-token embedding model (as
		// Qwen3-Embedding) is trained on the hidden state of the EOS its
		// tokenizer appends.
		cfg.Log.Warn("last-token pooling, but the model's tokenizer appends no EOS (tokenizer.ggml.add_eos_token is not true): each embedding is the last text token's; a file converted for an embedding model should append it")
	}
	s := &Server{
		pooling: pooling,
		cfg:     cfg,
		sess:    sess,
		tmpl:    sess.Template,
		format:  DetectToolFormat(sess.Template.Source()),
		nVocab:  nVocab,
		created: time.Now().Unix(),
		fp:      fingerprint(sess.Model),
		cors:    cfg.CORS,
		hosts:   hosts,
		bodies:  &bodyBudget{max: cfg.MaxBodiesBytes},
	}
	if fi, err := os.Stat(sess.Model.File.Path); err == nil {
		s.created = fi.ModTime().Unix()
	}
	s.sched = session.NewScheduler(sess.Engine, sess.Tok, cfg.Parallel)
	s.gen = s.sched.Generate
	s.base, s.cancelAll = context.WithCancel(context.Background())
	s.met = newMetrics(&cfg, sess)
	s.sched.Observe(s.met.observeStep)
	s.prep = newPreparation()
	s.q = newQueue(cfg.Parallel, cfg.QueueLimit, func(waiting, running int) {
		s.met.queueLength.Set(float64(waiting))
		s.met.running.Set(float64(running))
		if running == 0 && waiting == 0 {
			s.idle()
		}
	})
	s.q.onPanic = func(r any) {
		cfg.Log.Error("panic in generation", "panic", r, "stack", string(debug.Stack()))
	}
	s.handler = s.routes()
	return s, nil
}

// fingerprint is the system_fingerprint of responses: what produced them
// (ats and the architecture; the placement will join it once it varies).
func fingerprint(m *model.Model) string {
	return "ats-" + m.Hyper().Arch
}

// ToolFormat is the tool-call format the server parses replies with.
func (s *Server) ToolFormat() ToolFormat { return s.format }

// Handler returns the server's HTTP handler (for httptest, or to mount
// elsewhere). Serve uses it too.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on ln until Shutdown or Close. It returns nil
// after a shutdown.
func (s *Server) Serve(ln net.Listener) error {
	hs := newHTTPServer(s.handler, &s.cfg)
	if err := s.attach(hs); err != nil {
		return err
	}
	err := hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// newHTTPServer is the http.Server that serves h with cfg's timeouts.
func newHTTPServer(h http.Handler, cfg *Config) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
	}
}

// attach makes hs the HTTP server that Shutdown stops.
func (s *Server) attach(hs *http.Server) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutting.Load() {
		return errShuttingDown
	}
	s.httpSrv = hs
	return nil
}

// Shutdown stops taking generation requests and lets those accepted
// (running or queued) finish until ctx ends; then it cancels what is left,
// closes the connections and waits for the model to be idle. It returns
// ctx's error when it had to cancel. While it drains, the listener stays
// open: /health answers 503 "shutting down" and new generation requests
// get a 503, so a load balancer sees the state instead of refused
// connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutting.Store(true)
	workerDone := s.q.close()
	s.mu.Lock()
	hs := s.httpSrv
	s.mu.Unlock()
	if hs != nil {
		// Clients reconnect for their next request, and find the 503.
		hs.SetKeepAlivesEnabled(false)
	}
	var err error
	select {
	case <-workerDone:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil && hs != nil {
		// The worker is done; the handlers are writing their last bytes.
		err = hs.Shutdown(ctx)
	}
	if err != nil {
		s.cancelAll()
		if hs != nil {
			// The cancelled requests end within a token; let their
			// handlers tell the clients why before the connections close.
			ctx2, cancel := context.WithTimeout(context.Background(), time.Second)
			hs.Shutdown(ctx2)
			cancel()
			hs.Close()
		}
	}
	<-workerDone
	s.cancelAll()
	s.sched.Close() // every request has ended: the slots' sequences go
	return err
}

// Close cancels every request at once and stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// route is the handlers of one path, by method.
type route map[string]http.HandlerFunc

func (s *Server) routes() http.Handler {
	metricsHandler := promhttp.HandlerFor(s.met.reg, promhttp.HandlerOpts{})
	chatR := route{http.MethodPost: s.handleChat}
	complR := route{http.MethodPost: s.handleCompletion}
	modelsR := route{http.MethodGet: s.handleModels}
	healthR := route{http.MethodGet: s.handleHealth}
	pprofR := pprofRoute()
	table := map[string]route{
		// The paths without /v1 are aliases, as llama.cpp's server has
		// them, for clients configured with a bare base URL.
		"/v1/chat/completions": chatR, "/chat/completions": chatR,
		"/v1/completions": complR, "/completions": complR,
		"/v1/models": modelsR, "/models": modelsR,
		"/health": healthR, "/v1/health": healthR,
		"/metrics": {http.MethodGet: metricsHandler.ServeHTTP},
		// llama-server's utility endpoints.
		"/tokenize":         {http.MethodPost: s.handleTokenize},
		"/detokenize":       {http.MethodPost: s.handleDetokenize},
		"/props":            {http.MethodGet: s.handleProps},
		"/slots":            {http.MethodGet: s.handleSlots},
		"/v1/ats/placement": {http.MethodGet: s.handlePlacement},
	}
	// The other clients' APIs: Anthropic's, OpenAI's responses and
	// embeddings, ollama's (clients.go).
	for p, rt := range s.clientRoutes() {
		table[p] = rt
	}
	endpoints := map[string]string{}
	for p := range table {
		endpoints[p] = strings.TrimPrefix(p, "/v1")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		endpoint := "other"
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.cfg.Log.Error("panic in handler", "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				if !rec.wrote {
					writeError(rec, internalError(fmt.Errorf("internal error: %v", p)))
				}
			}
			code := rec.code
			if code == 0 {
				code = http.StatusOK
			}
			if rec.gone || !rec.wrote && r.Context().Err() != nil {
				code = statusClientClosed
			}
			s.met.requests.WithLabelValues(endpoint, fmt.Sprint(code)).Inc()
			s.met.requestDuration.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
			s.cfg.Log.Info("request", "method", r.Method, "path", r.URL.Path, "status", code, "duration", time.Since(start).Round(time.Microsecond))
		}()

		if !s.checkHost(rec, r) || !s.applyCORS(rec, r) {
			return
		}
		path := r.URL.Path
		rt, ok := table[path]
		var model string
		public := false // served without the API key
		if !ok {
			// /v1/models/{id}
			if id, found := strings.CutPrefix(path, "/v1/models/"); found && id != "" {
				rt, ok, model = modelsR, true, id
				endpoint = "/models/{id}"
			} else if a, found := webUIRoute(path); found {
				rt, ok, public = route{http.MethodGet: func(w http.ResponseWriter, r *http.Request) { s.serveWebUI(w, r, a) }}, true, true
				endpoint = "webui"
			}
			if prt, name, found := s.clientPrefixRoute(path); found {
				rt, ok, endpoint = prt, true, name
			}
			if s.cfg.PProf && strings.HasPrefix(path, "/debug/pprof/") {
				rt, ok, endpoint = pprofR, true, "/debug/pprof"
			}
		} else {
			endpoint = endpoints[path]
		}
		if !ok {
			writeError(rec, &apiError{Status: http.StatusNotFound, Type: typeNotFound,
				Message: fmt.Sprintf("no such endpoint: %s %s (ats serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/embeddings, /v1/models, ollama's /api/..., /health, /metrics, /tokenize, /detokenize, /props, /v1/ats/placement and the web UI at /)", r.Method, path)})
			return
		}
		if r.Method == http.MethodOptions {
			s.handleOptions(rec, r, rt)
			return
		}
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		h, ok := rt[method]
		if !ok {
			var allowed []string
			for m := range rt {
				allowed = append(allowed, m)
			}
			rec.Header().Set("Allow", strings.Join(allowed, ", "))
			writeError(rec, &apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest,
				Message: fmt.Sprintf("%s does not accept %s; use %s", path, r.Method, strings.Join(allowed, " or "))})
			return
		}
		if !public && endpoint != "/health" && !s.authorized(r) {
			writeError(rec, withCode(&apiError{Status: http.StatusUnauthorized, Type: typeAuthentication,
				Message: "invalid or missing API key: send it as \"Authorization: Bearer KEY\""}, "invalid_api_key"))
			return
		}
		if model != "" {
			r = r.WithContext(context.WithValue(r.Context(), modelIDKey{}, model))
		}
		h(rec, r)
	})
}

type modelIDKey struct{}

func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.APIKey == "" {
		return true
	}
	// Anthropic's clients send the key as x-api-key.
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(k)), []byte(s.cfg.APIKey)) == 1
	}
	// The scheme is case-insensitive (RFC 9110, section 11.1).
	scheme, got, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(s.cfg.APIKey)) == 1
}

// statusRecorder remembers the status code for the metrics and the log.
// Unwrap lets http.ResponseController reach the connection (Flush,
// deadlines).
type statusRecorder struct {
	http.ResponseWriter
	code  int
	wrote bool
	gone  bool // the client left before the response was complete
}

// statusClientClosed is what the metrics and the log count a request as
// when its client left before the response was complete (nginx's 499):
// not the 200 its headers may already have said.
const statusClientClosed = 499

// clientGone marks the request whose response w writes as abandoned by
// its client.
func clientGone(w http.ResponseWriter) {
	for {
		switch x := w.(type) {
		case *statusRecorder:
			x.gone = true
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return
		}
	}
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.code, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	waiting, running := s.q.length()
	status, code := "ok", http.StatusOK
	if s.shutting.Load() {
		status, code = "shutting down", http.StatusServiceUnavailable
	} else if s.checkModelFile() != nil {
		status, code = "model file changed", http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"status": status, "model": s.cfg.ModelName, "queue": waiting, "busy": running > 0,
		"slots_idle": s.cfg.Parallel - running, "slots_processing": running}, s.cfg.WriteTimeout)
}

func (s *Server) modelInfo() modelOut {
	h := s.sess.Model.Hyper()
	return modelOut{ID: s.cfg.ModelName, Object: "model", Created: s.created, OwnedBy: "ats",
		Meta: map[string]any{
			"arch":        h.Arch,
			"n_ctx":       s.sess.CtxSize(),
			"n_ctx_train": h.NCtxTrain,
			"n_vocab":     h.NVocab,
			"size":        s.sess.Model.WeightBytes(),
			"tool_format": s.format.String(),
			"chat_family": s.tmpl.Family(),
			"queue_limit": s.cfg.QueueLimit,
			"parallel":    s.cfg.Parallel,
		}}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if id, ok := r.Context().Value(modelIDKey{}).(string); ok {
		if id != s.cfg.ModelName {
			writeError(w, withCode(&apiError{Status: http.StatusNotFound, Type: typeInvalidRequest,
				Message: fmt.Sprintf("the model %q does not exist; this server serves %q", id, s.cfg.ModelName)}, "model_not_found"))
			return
		}
		writeJSON(w, http.StatusOK, s.modelInfo(), s.cfg.WriteTimeout)
		return
	}
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelOut{s.modelInfo()}}, s.cfg.WriteTimeout)
}

// newID makes a response id like OpenAI's.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
