package server

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
)

// DNS rebinding: a web page on attacker.example makes its visitor's
// browser resolve attacker.example to 127.0.0.1, and its scripts then
// reach this server as their own origin: the browser sends
// "Host: attacker.example:PORT" and treats the answers as same-origin, so
// neither CORS nor the cross-origin check stops them. The Host header is
// what gives it away, so requests must name this server: localhost, a
// loopback address, the address the connection reached, or a name the
// operator allowed (--allowed-hosts). A browser never sends those for an
// attacker's page.

// HostPolicy says which Host header values the server answers.
type HostPolicy struct {
	any      bool            // "*": every host (behind a proxy that checks it)
	names    map[string]bool // lower case, without port
	suffixes []string        // ".example.com": that domain and its subdomains
}

// ParseAllowedHosts reads a comma-separated list of host names, besides
// the ones always allowed (localhost, loopback addresses, the address the
// server listens on):
//
//	ats.example.com   that name (any port)
//	.example.com      example.com and every name under it
//	192.168.1.20      that address
//	*                 any host: for a server behind a proxy that checks the Host itself
//
// An empty list allows only the default ones.
func ParseAllowedHosts(spec []string) (*HostPolicy, error) {
	p := &HostPolicy{names: map[string]bool{}}
	for _, item := range spec {
		for e := range strings.SplitSeq(item, ",") {
			e = strings.ToLower(strings.TrimSpace(e))
			switch {
			case e == "":
			case e == "*":
				p.any = true
			case strings.Contains(e, "/") || strings.Contains(e, "*") || strings.Contains(e, "@"):
				return nil, fmt.Errorf("allowed host %q: want a host name such as ats.example.com, a domain such as .example.com, an address, or *", e)
			case strings.HasPrefix(e, "."):
				if len(e) < 2 {
					return nil, fmt.Errorf("allowed host %q: a domain needs a name after the dot", e)
				}
				p.suffixes = append(p.suffixes, e)
			default:
				if h, _, err := net.SplitHostPort(e); err == nil {
					return nil, fmt.Errorf("allowed host %q: give the name without a port (%s): every port is allowed", e, h)
				}
				p.names[strings.Trim(e, "[]")] = true
			}
		}
	}
	return p, nil
}

// String lists the allowed names, as ParseAllowedHosts reads them.
func (p *HostPolicy) String() string {
	var out []string
	if p.any {
		out = append(out, "*")
	}
	for n := range p.names {
		out = append(out, n)
	}
	out = append(out, p.suffixes...)
	slices.Sort(out)
	return strings.Join(out, ",")
}

// hostName is the host of a Host header, lower case, without port,
// brackets or a final dot.
func hostName(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
}

// allowsHost reports whether the server answers a request with r's Host.
func (p *HostPolicy) allowsHost(r *http.Request) bool {
	if r.Host == "" || p.any {
		return true // HTTP/1.0 without Host: not a browser
	}
	h := hostName(r.Host)
	// Browsers resolve localhost and its subdomains to loopback
	// themselves (RFC 6761), so no page can rebind them.
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	if ip := net.ParseIP(h); ip != nil {
		// 0.0.0.0 and :: reach this machine too (a server listening on
		// all addresses is bound to them); an address, unlike a name,
		// cannot be rebound.
		if ip.IsLoopback() || ip.IsUnspecified() {
			return true
		}
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if a, ok := local.(*net.TCPAddr); ok && a.IP.Equal(ip) {
				return true // the address the client connected to
			}
		}
	}
	if p.names[h] {
		return true
	}
	for _, suf := range p.suffixes {
		if h == suf[1:] || strings.HasSuffix(h, suf) {
			return true
		}
	}
	return false
}

// checkHost answers 403 itself (returning false) for a request whose Host
// names another server.
func (s *Server) checkHost(w http.ResponseWriter, r *http.Request) bool {
	if s.hosts.allowsHost(r) {
		return true
	}
	// Not a client to keep talking to, nor to wait for the body of.
	w.Header().Set("Connection", "close")
	allowed := "localhost, loopback addresses and the address it listens on"
	if extra := s.hosts.String(); extra != "" {
		allowed += ", and " + extra
	}
	writeError(w, withCode(&apiError{Status: http.StatusForbidden, Type: typePermission,
		Message: fmt.Sprintf("the Host %q is not one this server answers to (%s): a web page that renamed its own domain to this address (DNS rebinding) sends such Hosts; to reach the server by that name, start it with --allowed-hosts %s", r.Host, allowed, hostName(r.Host))},
		"host_not_allowed"))
	return false
}
