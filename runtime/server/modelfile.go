package server

import (
	"fmt"
	"net/http"
)

// The model's weights are read from the mapped model file while serving.
// A file changed in place is not the model that was loaded, and one
// truncated makes reads past its new end fault (SIGBUS): see
// gguf.File.Changed. The worker looks at the file before each generation
// and stops serving once it changed, answering 503 until the server is
// restarted; a fault during a generation (the file truncated in the
// middle of it) becomes a panic on the worker (SetPanicOnFault, there and
// in the kernels' thread pool) that ends that request the same way. A
// file replaced by renaming a new one over it is not seen: the server
// keeps the old one open, and a restart loads the new one.

// checkModelFile returns the error to answer with once the model file has
// changed, nil while it has not.
func (s *Server) checkModelFile() *apiError {
	if e := s.fileErr.Load(); e != nil {
		return e
	}
	err := s.sess.Model.File.Changed()
	if err == nil {
		return nil
	}
	e := withCode(&apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable,
		Message: fmt.Sprintf("%v; restart the server to load the model again", err)}, "model_file_changed")
	if s.fileErr.CompareAndSwap(nil, e) {
		s.cfg.Log.Error("the model file changed on disk; generation requests get 503 until the server is restarted", "error", err)
	}
	return s.fileErr.Load()
}
