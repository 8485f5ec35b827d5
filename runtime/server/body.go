package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// Each connection may send a body of up to MaxBodyBytes, and a slow one
// holds what it sent for the read timeout: without a bound over all of
// them, a few hundred stalled bodies take gigabytes (issue 33). The bytes
// of the bodies being read are counted against MaxBodiesBytes as they
// arrive; a body that would pass it gets 503 and its connection is
// closed, and the bytes are given back once the body is decoded. The read
// timeout (ReadTimeout) bounds how long a body may take.

// bodyBudget counts the bytes of request bodies in memory.
type bodyBudget struct {
	mu   sync.Mutex
	used int64
	max  int64
}

// take reserves n bytes, or reports that they are not there.
func (b *bodyBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *bodyBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// inUse is the bytes taken (for tests and the log).
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// errBodiesFull is what readAll returns when the budget is spent.
var errBodiesFull = errors.New("too many request bodies in memory")

// bodyChunk is how much of a body of unknown length is read (and
// reserved) at a time.
const bodyChunk = 64 << 10

// readAll reads a body of at most limit bytes (r already enforces it)
// within the budget. The buffer grows (doubling, up to the declared
// Content-Length) as bytes arrive, and only then takes from the budget:
// a client must send the bytes it holds, declaring a length is not
// enough. The caller gives back held once done with the bytes.
func (b *bodyBudget) readAll(r io.Reader, contentLength, limit int64) (body []byte, held int64, err error) {
	most := limit + 1 // the reader fails past limit
	if contentLength >= 0 {
		most = min(contentLength, most)
	}
	var probe [1]byte
	for {
		if len(body) == cap(body) {
			// Full: a one-byte read tells the end from more to come
			// before anything more is reserved.
			n, err := r.Read(probe[:])
			if n == 0 {
				if err == io.EOF {
					return body, held, nil
				}
				if err != nil {
					return body, held, err
				}
				continue
			}
			size := min(max(2*int64(cap(body)), int64(cap(body))+bodyChunk), max(most, int64(len(body))+1))
			if !b.take(size - held) {
				return nil, held, errBodiesFull
			}
			held = size
			nb := make([]byte, len(body), size)
			copy(nb, body)
			body = append(nb, probe[0])
			if err == io.EOF {
				return body, held, nil
			}
			if err != nil {
				return body, held, err
			}
			continue
		}
		n, err := r.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			return body, held, nil
		}
		if err != nil {
			return body, held, err
		}
	}
}

// busyBodies is the 503 for a request whose body does not fit the budget.
func busyBodies(max int64) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable,
		Message: fmt.Sprintf("the server is receiving too many request bodies at once (%d bytes in all); try again shortly", max)}
}
