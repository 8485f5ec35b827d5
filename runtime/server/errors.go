package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// apiError is an error in the shape of OpenAI's error responses:
//
//	{"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": null}}
//
// Clients (the official SDKs among them) read the message and the status
// code from it, so every failure the server reports goes through it.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// Error types, as OpenAI names them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeNotFound       = "not_found_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable_error"
)

// badRequest is a 400 about param (which may be "").
func badRequest(param, format string, args ...any) *apiError {
	e := &apiError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &param
	}
	return e
}

func withCode(e *apiError, code string) *apiError {
	e.Code = &code
	return e
}

func internalError(err error) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Type: typeServer, Message: err.Error()}
}

// asAPIError turns any error into an apiError, keeping one that already is.
func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	return internalError(err)
}

// writeError sends e as the whole response.
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.Status == http.StatusServiceUnavailable {
		// Queue full or shutting down: the client may try again soon.
		h.Set("Retry-After", "1")
	}
	if e.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="ats"`)
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(map[string]*apiError{"error": e})
	w.Write(append(b, '\n'))
}
