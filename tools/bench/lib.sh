# Shell functions the bench scripts share; they source this file.

# up URL: waits for a server's /health (10 minutes at most).
up() {
	for _ in $(seq 1 1200); do
		curl -sf "$1/health" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	return 1
}
