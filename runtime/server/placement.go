package server

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// handlePlacement answers GET /v1/ats/placement: the placement map of the
// loaded model (which tensor of which layer runs on which backend, with
// the plan's budget and predictions), as Config.PlacementMap gives it.
// The machine page of the web UI draws it.
func (s *Server) handlePlacement(w http.ResponseWriter, r *http.Request) {
	if s.cfg.PlacementMap == nil {
		writeError(w, withCode(&apiError{Status: http.StatusNotFound, Type: typeNotFound,
			Message: "this server has no placement map: the model runs without a CPU+GPU plan (CPU only)"}, "no_placement"))
		return
	}
	b, err := s.cfg.PlacementMap()
	if err != nil {
		writeError(w, internalError(fmt.Errorf("placement map: %w", err)))
		return
	}
	if !json.Valid(b) {
		writeError(w, internalError(fmt.Errorf("placement map: the producer gave %d bytes that are not JSON", len(b))))
		return
	}
	writeJSON(w, http.StatusOK, json.RawMessage(b), s.cfg.WriteTimeout)
}
