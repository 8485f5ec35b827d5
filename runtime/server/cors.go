package server

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// CORSPolicy says which web pages of other origins may call the API from a
// browser. Browsers ask first (a preflight OPTIONS request, answered
// without the API key) and then send the request with an Origin header;
// the server answers with Access-Control-Allow-Origin when the origin is
// allowed. Requests from pages of the server's own origin (the web UI) and
// from programs that are not browsers need no permission.
//
// A cross-origin request that changes something (POST) from an origin
// that is not allowed is refused with 403 before it reaches the model:
// without that, any web site could make its visitors' browsers spend this
// server's time, even though it could not read the answers.
type CORSPolicy struct {
	any      bool            // "*"
	loopback bool            // "localhost": http(s)://localhost, 127.0.0.0/8, [::1] on any port
	origins  map[string]bool // normalized "scheme://host[:port]", or "null"
}

// DefaultCORS allows pages served from this machine's loopback addresses
// (a front end in development on localhost:5173, say) and no others.
const DefaultCORS = "localhost"

// ParseCORS reads a comma-separated list of allowed origins:
//
//	localhost                 http(s) pages on localhost, 127.0.0.1 or [::1], any port
//	*                         every origin
//	none                      no origin (only same-origin pages and non-browser clients)
//	https://app.example.com   that origin exactly (scheme, host and port)
//	null                      pages without an origin (opened from a file)
//
// Entries combine: "localhost,https://app.example.com".
func ParseCORS(spec string) (*CORSPolicy, error) {
	p := &CORSPolicy{origins: map[string]bool{}}
	var entries []string
	for e := range strings.SplitSeq(spec, ",") {
		if e = strings.TrimSpace(e); e != "" {
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("CORS origins %q: empty; use \"none\" to allow no other origin", spec)
	}
	for _, e := range entries {
		switch strings.ToLower(e) {
		case "*":
			p.any = true
			continue
		case "localhost":
			p.loopback = true
			continue
		case "none":
			if len(entries) > 1 {
				return nil, fmt.Errorf("CORS origins %q: \"none\" cannot be combined with other origins", spec)
			}
			continue
		case "null":
			p.origins["null"] = true
			continue
		}
		o, err := normalizeOrigin(e)
		if err != nil {
			return nil, fmt.Errorf("CORS origins %q: %w", spec, err)
		}
		p.origins[o] = true
	}
	return p, nil
}

// normalizeOrigin turns "HTTPS://App.example.com:443/" into the form
// browsers send in the Origin header: "https://app.example.com".
func normalizeOrigin(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" {
		return "", fmt.Errorf("%q is not an origin such as https://app.example.com or http://localhost:3000", s)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%q: an origin is a scheme, a host and a port, without a path, query or user (%s://%s)", s, u.Scheme, u.Host)
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if strings.Contains(host, "*") {
		return "", fmt.Errorf("%q: wildcards in host names are not supported; list the origins, or use \"*\" for all", s)
	}
	if port == "" || scheme == "http" && port == "80" || scheme == "https" && port == "443" {
		if strings.Contains(host, ":") {
			return scheme + "://[" + host + "]", nil
		}
		return scheme + "://" + host, nil
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

// String is the policy in ParseCORS's syntax.
func (p *CORSPolicy) String() string {
	var out []string
	if p.any {
		out = append(out, "*")
	}
	if p.loopback {
		out = append(out, "localhost")
	}
	origins := make([]string, 0, len(p.origins))
	for o := range p.origins {
		origins = append(origins, o)
	}
	slices.Sort(origins)
	out = append(out, origins...)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ",")
}

// AllowsAll reports whether every origin is allowed ("*").
func (p *CORSPolicy) AllowsAll() bool { return p.any }

// Allows reports whether a page of origin (an Origin header's value) may
// call the API.
func (p *CORSPolicy) Allows(origin string) bool {
	if origin == "" {
		return false
	}
	if p.any || p.origins[origin] {
		return true
	}
	if origin == "null" {
		return false
	}
	o, err := normalizeOrigin(origin)
	if err != nil {
		return false
	}
	if p.origins[o] {
		return true
	}
	if p.loopback {
		u, _ := url.Parse(o)
		if u.Scheme != "http" && u.Scheme != "https" {
			return false
		}
		host := u.Hostname()
		if host == "localhost" {
			return true
		}
		ip := net.ParseIP(host)
		return ip != nil && ip.IsLoopback()
	}
	return false
}

// crossOrigin refuses unsafe requests from pages of other origins that the
// policy does not allow. Same-origin pages (the web UI) pass, recognised by
// Sec-Fetch-Site or by an Origin that matches the Host header.
var crossOrigin = http.NewCrossOriginProtection()

// applyCORS adds the CORS response headers for an allowed origin, and
// answers 403 itself (returning false) for an unsafe request of a page
// whose origin is not allowed.
func (s *Server) applyCORS(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	h := w.Header()
	if origin != "" && s.cors.Allows(origin) {
		if s.cors.any {
			h.Set("Access-Control-Allow-Origin", "*")
		} else {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Add("Vary", "Origin")
		}
		// Let browser clients read why they must wait or authenticate.
		h.Set("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate")
		return true
	}
	if !s.cors.any {
		h.Add("Vary", "Origin")
	}
	if err := crossOrigin.Check(r); err != nil {
		writeError(w, withCode(&apiError{Status: http.StatusForbidden, Type: typePermission,
			Message: fmt.Sprintf("cross-origin request from %s refused: this server allows the origins %q (ats serve --cors sets them)", originName(origin), s.cors.String())},
			"origin_not_allowed"))
		return false
	}
	return true
}

func originName(origin string) string {
	if origin == "" {
		return "another site"
	}
	return origin
}

// handleOptions answers OPTIONS for a route: a CORS preflight when the
// browser sends one, else the methods the route takes. Neither needs the
// API key: a preflight never carries it.
func (s *Server) handleOptions(w http.ResponseWriter, r *http.Request, rt route) {
	methods := []string{http.MethodOptions}
	for m := range rt {
		methods = append(methods, m)
		if m == http.MethodGet {
			methods = append(methods, http.MethodHead)
		}
	}
	slices.Sort(methods)
	allow := strings.Join(methods, ", ")
	h := w.Header()
	h.Set("Allow", allow)
	origin := r.Header.Get("Origin")
	if origin == "" || r.Header.Get("Access-Control-Request-Method") == "" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !s.cors.Allows(origin) {
		writeError(w, withCode(&apiError{Status: http.StatusForbidden, Type: typePermission,
			Message: fmt.Sprintf("origin %s is not allowed: this server allows the origins %q (ats serve --cors sets them)", origin, s.cors.String())},
			"origin_not_allowed"))
		return
	}
	h.Set("Access-Control-Allow-Methods", allow)
	// Echo the headers asked for: clients add their own (the OpenAI SDK
	// sends X-Stainless-*), and "*" would not cover Authorization.
	if req := r.Header.Values("Access-Control-Request-Headers"); len(req) > 0 {
		h.Set("Access-Control-Allow-Headers", strings.Join(req, ", "))
	}
	h.Set("Access-Control-Max-Age", "7200")
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	w.WriteHeader(http.StatusNoContent)
}

// typePermission is OpenAI's error type for a refused permission.
const typePermission = "permission_error"
