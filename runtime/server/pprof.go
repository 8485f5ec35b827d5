package server

import (
	"net/http"
	"net/http/pprof"
)

// pprofRoute serves Go's profiles (net/http/pprof) under /debug/pprof/, for
// Config.PProf: heap and goroutine profiles show where memory or
// goroutines leak. Like every endpoint but /health it needs the API key.
func pprofRoute() route {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return route{http.MethodGet: mux.ServeHTTP, http.MethodPost: mux.ServeHTTP}
}
