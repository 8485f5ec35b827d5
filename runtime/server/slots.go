package server

import (
	"net/http"
	"time"
)

// slotOut is one slot in GET /slots, in llama-server's shape where the
// fields mean the same (id, n_ctx, is_processing, next_token), with
// ats's own figures beside them.
type slotOut struct {
	ID           int            `json:"id"`
	IDTask       int            `json:"id_task"`
	NCtx         int            `json:"n_ctx"`
	Speculative  bool           `json:"speculative"`
	IsProcessing bool           `json:"is_processing"`
	NextToken    slotNextToken  `json:"next_token"`
	Prompt       slotPromptInfo `json:"prompt_progress"`
	// NCached is the tokens of the slot's sequence in the KV cache: the
	// running request's so far, or the last one's, kept for reuse.
	NCached int `json:"n_cached"`
	// RunningSeconds is how long the request has been on the slot.
	RunningSeconds float64 `json:"running_seconds,omitempty"`
}

type slotNextToken struct {
	HasNextToken bool `json:"has_next_token"`
	NDecoded     int  `json:"n_decoded"`
}

// slotPromptInfo is the running request's prompt: its tokens, of which
// evaluated so far (reused ones included).
type slotPromptInfo struct {
	Total     int `json:"total"`
	Processed int `json:"processed"`
}

// handleSlots answers GET /slots: each slot's state.
func (s *Server) handleSlots(w http.ResponseWriter, r *http.Request) {
	ctx := s.sess.CtxSize()
	var out []slotOut
	for _, si := range s.sched.Slots() {
		o := slotOut{ID: si.ID, IDTask: -1, NCtx: ctx, IsProcessing: si.Busy, NCached: si.Cached}
		if si.Busy {
			o.NextToken = slotNextToken{HasNextToken: true, NDecoded: si.Generated}
			o.Prompt = slotPromptInfo{Total: si.PromptTokens, Processed: si.Prefilled}
			o.RunningSeconds = time.Since(si.Started).Seconds()
		}
		out = append(out, o)
	}
	writeJSON(w, http.StatusOK, out, s.cfg.WriteTimeout)
}
