package cudadrv

import (
	"errors"
	"fmt"
	"strings"
)

// libraryNotFoundError says that no candidate of a driver library loaded.
// Its message is one short line, since it is what a machine without a GPU
// shows on every run; Detail lists every place tried and why each failed,
// for `ats gpu` (through Available and OpenMonitor).
type libraryNotFoundError struct {
	name  string
	tried []string
}

func (e *libraryNotFoundError) Error() string {
	return fmt.Sprintf("no %s found (searched %d places; `ats gpu` lists them)", e.name, len(e.tried))
}

// Detail is the message with every attempt.
func (e *libraryNotFoundError) Detail() string {
	return fmt.Sprintf("no %s found; tried %s", e.name, strings.Join(e.tried, ", "))
}

// errorDetail is err's message with the detail of a library search where
// it holds one.
func errorDetail(err error) string {
	var nf *libraryNotFoundError
	if errors.As(err, &nf) {
		return strings.Replace(err.Error(), nf.Error(), nf.Detail(), 1)
	}
	return err.Error()
}
