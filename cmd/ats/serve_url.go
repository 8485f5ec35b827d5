package main

import (
	"net"
	"os"
	"strconv"
)

// serveURLs says where a server listening on addr can be reached: a URL
// that works from this machine, and, when it listens on every interface
// (--host 0.0.0.0 or ::, which Go reports as [::]), one with the
// machine's name for the others. A URL of [::] or 0.0.0.0 is an address to
// bind, not one to browse to.
func serveURLs(addr net.Addr) (local, remote string) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return "http://" + addr.String(), ""
	}
	port := strconv.Itoa(tcp.Port)
	if !tcp.IP.IsUnspecified() {
		return "http://" + net.JoinHostPort(tcp.IP.String(), port), ""
	}
	// Go's "tcp" listeners on [::] take IPv4 too (it clears IPV6_V6ONLY),
	// so the IPv4 loopback always answers.
	local = "http://" + net.JoinHostPort("127.0.0.1", port)
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		remote = "http://" + net.JoinHostPort(h, port)
	}
	return local, remote
}
