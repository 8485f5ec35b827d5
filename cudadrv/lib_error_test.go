package cudadrv

import (
	"errors"
	"strings"
	"testing"
)

// A missing driver library is one short line in Init's error (what every
// command on a machine without a GPU prints) and the full list of places
// tried in Available's reason (what ats gpu prints).
func TestLibraryNotFoundShortAndDetail(t *testing.T) {
	var tried []string
	for i := range 16 {
		tried = append(tried, "/usr/lib/dir"+strings.Repeat("x", i)+"/libcuda.so.1 (absent)")
	}
	nf := &libraryNotFoundError{name: "libcuda.so.1", tried: tried}
	err := error(&unavailableError{msg: nf.Error(), cause: nf})
	short := err.Error()
	if len(short) > 120 || !strings.Contains(short, "no libcuda.so.1 found") || !strings.Contains(short, "searched 16 places") ||
		strings.Contains(short, "/usr/lib") {
		t.Errorf("short message (%d bytes): %q", len(short), short)
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Error("does not wrap ErrUnavailable")
	}
	detail := errorDetail(err)
	if !strings.HasPrefix(detail, "cudadrv: CUDA unavailable: no libcuda.so.1 found; tried ") || !strings.Contains(detail, tried[15]) {
		t.Errorf("detail: %q", detail)
	}
	if d := errorDetail(errors.New("plain")); d != "plain" {
		t.Errorf("errorDetail of another error: %q", d)
	}
}
