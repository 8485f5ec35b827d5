package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/server"
	"github.com/atsinfer/ats/runtime/session"
)

func init() {
	register(func() *cobra.Command {
		var (
			modelPath, host, apiKey, alias string
			embeddings                     bool
			pooling                        string
			corsOrigins                    string
			allowedHosts                   []string
			port, ctxSize, thrds, queue    int
			parallel                       int
			pf                             placementFlags
			grace                          time.Duration
			verbose, pprof                 bool
			sf                             samplingFlags
		)
		cmd := &cobra.Command{
			Use:   "serve MODEL [--host 127.0.0.1] [--port 8080]",
			Short: "Serve a model over HTTP with OpenAI's API",
			Long: `serve answers OpenAI-style requests: POST /v1/chat/completions (streamed or
not, with tools and reasoning), POST /v1/completions, GET /v1/models,
GET /health and GET /metrics (Prometheus), llama-server's POST /tokenize,
POST /detokenize and GET /props, and a web UI at / (chat, and a machine
page with the placement map and live figures).

The port is taken before the model loads; until it is ready, /health
answers 503 {"status": "loading"}. Up to --parallel requests run at once:
every step computes one token of each request that is generating and a
chunk of the prompts that wait, so each weight is read once for all of
them. Up to --queue more wait for a slot (their prompts are rendered and
tokenized only once admitted); beyond that, 503. The slots share one KV
cache of --ctx-size positions; a request that continues an earlier
conversation, or shares its beginning with another request (a system
prompt), reuses its cache. GET /slots shows each slot. The sampling flags
set the defaults for requests that leave a setting out.

Beyond loopback, set --api-key (or $ATS_API_KEY): clients then send
"Authorization: Bearer KEY". Web pages of other origins may call the API
from a browser when --cors allows their origin (default: pages on
localhost); the API key is still required. Requests must name this server
in their Host header: localhost, a loopback address or the address they
reached; a server reached by a name (ats.example.com, behind a proxy) needs
--allowed-hosts with that name. Other Hosts get 403: that is what a web
page that points its own domain at this server (DNS rebinding) sends.

On SIGINT or SIGTERM the server stops taking requests, lets running ones
finish for --shutdown-grace (meanwhile /health answers 503 and new
requests get 503), cancels the rest and exits; a second Ctrl-C quits at
once.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return errors.New("serve: -m MODEL is required")
				}
				if apiKey == "" {
					apiKey = os.Getenv("ATS_API_KEY")
				}
				cfg, err := sf.config()
				if err != nil {
					return err
				}
				if len(sf.stop) > 0 {
					return errors.New("serve: --stop is per request; send \"stop\" in the request instead")
				}
				cors, err := server.ParseCORS(corsOrigins)
				if err != nil {
					return fmt.Errorf("serve: --cors: %w", err)
				}
				if _, err := server.ParseAllowedHosts(allowedHosts); err != nil {
					return fmt.Errorf("serve: --allowed-hosts: %w", err)
				}
				stderr := cmd.ErrOrStderr()
				level := slog.LevelWarn
				if verbose {
					level = slog.LevelInfo
				}
				log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
				warn := func(s string) { fmt.Fprintln(stderr, "ats: warning:", s) }
				copt := session.Options{CtxSize: ctxSize, Threads: thrds}
				if err := pf.apply(&copt, stderr); err != nil {
					return err
				}

				// Take the port first: a busy one is reported at once, not
				// after loading, and until the model is there the port
				// answers 503 "loading" (Listen).
				ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
				if err != nil {
					return fmt.Errorf("serve: %w", err)
				}
				if alias == "" {
					alias = strings.TrimSuffix(filepath.Base(modelPath), ".gguf")
				}
				if parallel < 1 || parallel > server.MaxParallel {
					return fmt.Errorf("serve: --parallel %d: want 1 to %d", parallel, server.MaxParallel)
				}
				scfg := server.Config{ModelName: alias, APIKey: apiKey, Parallel: parallel, QueueLimit: queue, Sampling: &cfg, Log: log, GPUStats: nvmlStats, PProf: pprof, CORS: cors,
					Embeddings: embeddings, Pooling: pooling, AllowedHosts: allowedHosts}
				starting := server.Listen(ln, scfg)
				url, remote := serveURLs(ln.Addr())
				fmt.Fprintf(stderr, "ats: listening on %s; loading the model (/health answers 503 until it is ready)\n", url)
				sess, err := loadSession(modelPath, copt, stderr, warn)
				if err != nil {
					starting.Close()
					return err
				}
				defer sess.Model.Close()
				defer sess.Close()
				if err := checkRepeatWindow(cfg.RepeatLastN, sess.CtxSize()); err != nil {
					starting.Close()
					return fmt.Errorf("serve: --repeat-last-n: %w", err)
				}
				if sess.Backend() != executor.BackendCPU {
					scfg.PlacementMap = sess.Placement.JSON
				}
				scfg.Models = ollamaModelInfo(sess.Model)
				if embeddings && pooling == "" {
					if p, err := session.FilePooling(sess.Model.File); err == nil && p == session.PoolingUnset {
						scfg.Pooling = "last"
						warn("the model file names no pooling for embeddings; using the last token's hidden state (--pooling mean|cls|last chooses)")
					}
				}
				srv, err := server.New(sess, scfg)
				if err != nil {
					starting.Close()
					return err
				}
				if err := starting.Ready(srv); err != nil {
					starting.Close()
					return err
				}
				if apiKey == "" && !loopback(host) {
					warn(fmt.Sprintf("serving on %s without --api-key: anyone who can reach this port can use the model", host))
				}
				if apiKey == "" && cors.AllowsAll() {
					warn("--cors * without --api-key: every web page opened in a browser that can reach this server can use the model")
				}
				// Catch the signals before saying we serve, so whoever waits
				// for that line can stop us gracefully at once.
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				if remote != "" {
					remote = "; on every interface, " + remote + " from other machines"
				}
				fmt.Fprintf(stderr, "ats: serving on %s (OpenAI API at %s/v1%s; tool calls: %s; %d slots, queue %d)\n",
					url, url, remote, srv.ToolFormat(), parallel, queue)
				served := starting.Served()
				select {
				case err := <-served:
					srv.Close()
					return fmt.Errorf("serve: %w", err)
				case <-ctx.Done():
				}
				// From now on a second signal kills the process the
				// default way: the way out when the grace period is long.
				stop()
				fmt.Fprintf(stderr, "ats: shutting down: finishing running requests for up to %s (Ctrl-C again to quit now)\n", grace)
				sctx, cancel := context.WithTimeout(context.Background(), grace)
				defer cancel()
				if err := srv.Shutdown(sctx); errors.Is(err, context.DeadlineExceeded) {
					fmt.Fprintln(stderr, "ats: cancelled the requests still running")
				} else if err != nil {
					return fmt.Errorf("serve: shutdown: %w", err)
				}
				if err := <-served; err != nil {
					return fmt.Errorf("serve: %w", err)
				}
				fmt.Fprintln(stderr, "ats: stopped")
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.StringVar(&host, "host", "127.0.0.1", "address to listen on (0.0.0.0: every interface)")
		f.IntVar(&port, "port", 8080, "port to listen on (0: any free port)")
		f.StringVar(&apiKey, "api-key", "", "require this key as \"Authorization: Bearer KEY\" (default $ATS_API_KEY)")
		f.StringVarP(&alias, "alias", "a", "", "model id in the API (default: the file name without .gguf)")
		f.BoolVar(&embeddings, "embeddings", false, "serve /v1/embeddings and ollama's /api/embed (llama-server's --embeddings)")
		f.StringVar(&pooling, "pooling", "", "how an embedding pools its tokens: mean, cls or last (default: what the model file says, else last)")
		f.StringVar(&corsOrigins, "cors", server.DefaultCORS, "origins whose web pages may call the API from a browser: comma-separated origins (https://app.example.com), localhost (any port), * (all) or none")
		f.StringSliceVar(&allowedHosts, "allowed-hosts", nil, "host names the server answers to besides localhost, loopback and the address it listens on: names (ats.example.com), domains (.example.com), addresses, or * (any: behind a proxy that checks the Host)")
		f.IntVarP(&ctxSize, "ctx-size", "c", 0, "KV cache positions, shared by the slots; one request may use them all (0: the model's context, at most 4096)")
		f.IntVarP(&thrds, "threads", "t", 0, "CPU threads (0: all cores)")
		pf.register(f)
		f.IntVarP(&parallel, "parallel", "", 4, "requests that run at once, batched together (llama-server's -np); they share the --ctx-size cache")
		// llama-server's -cb: ats always batches; taken so its command lines run.
		f.Bool("cont-batching", true, "always on: the running requests are batched")
		f.MarkHidden("cont-batching")
		f.IntVar(&queue, "queue", 16, "requests that may wait for a slot while --parallel run; more get 503")
		f.DurationVar(&grace, "shutdown-grace", 30*time.Second, "on SIGINT/SIGTERM, how long running requests may take to finish before they are cancelled")
		f.BoolVarP(&verbose, "verbose", "v", false, "log every request and generation")
		f.BoolVar(&pprof, "pprof", false, "serve Go's profiles at /debug/pprof/ (behind --api-key like the API), to find leaks")
		sf.register(f)
		// Stop strings belong to a request ("stop"), not to the server.
		f.MarkHidden("stop")
		return cmd
	})
}

// loopback reports whether host only accepts local connections.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// nvmlStats reads every GPU's figures through NVML (none without it).
func nvmlStats() []server.GPUStat {
	var out []server.GPUStat
	for _, g := range cuda.Stats() {
		out = append(out, server.GPUStat{Index: g.Index, Name: g.Name, MemoryUsedBytes: int64(g.MemUsed), MemoryTotalBytes: int64(g.MemTotal),
			Utilization: g.Util, PCIeRxBytesPerS: g.PCIeRX, PCIeTxBytesPerS: g.PCIeTX})
	}
	return out
}

// ollamaModelInfo tells ollama's clients what the served model is.
func ollamaModelInfo(m *model.Model) *server.ModelInfo {
	info := &server.ModelInfo{Family: m.Hyper().Arch, Size: m.File.Size()}
	if ft, err := m.File.Uint("general.file_type"); err == nil {
		info.Quantization = strings.TrimSuffix(llamaFileTypeName(ft), " (guessed)")
	}
	var n uint64
	for _, t := range m.File.Tensors {
		c := uint64(1)
		for _, d := range t.Dims {
			c *= d
		}
		n += c
	}
	info.ParameterSize = inspParams(n)
	if fi, err := os.Stat(m.File.Path); err == nil {
		info.Modified = fi.ModTime()
	}
	return info
}
