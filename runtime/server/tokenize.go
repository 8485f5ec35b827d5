package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"runtime/debug"
	"unicode/utf8"
)

// llama-server's utility endpoints, in its request and response shapes:
// POST /tokenize, POST /detokenize and GET /props. Tools written for
// llama-server (token counters, prompt builders, its web UI) use them.

// tokenizeRequest is the body of POST /tokenize.
type tokenizeRequest struct {
	// Content is a string, or an array mixing strings and token ids
	// (ids pass through, as llama-server's tokenize_mixed does).
	Content json.RawMessage `json:"content"`
	// AddSpecial adds BOS (and EOS) where the model's tokenizer wants
	// them. Default false.
	AddSpecial bool `json:"add_special"`
	// ParseSpecial turns special tokens written in the text
	// (<|im_start|>) into their ids; false tokenizes them as plain text.
	// Default true.
	ParseSpecial *bool `json:"parse_special"`
	// WithPieces returns {"id", "piece"} objects instead of bare ids.
	WithPieces bool `json:"with_pieces"`
}

// tokenPiece is one token with its text; Piece is a string when the text
// is valid UTF-8, else the list of its bytes (a piece may hold part of a
// character), as llama-server sends it.
type tokenPiece struct {
	ID    int `json:"id"`
	Piece any `json:"piece"`
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	// Tokenizing takes memory with the text: one request at a time, with
	// the generation requests' own preparation (limits.go).
	select {
	case s.prep.slot <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	ids, e := s.tokenizeContent(req)
	<-s.prep.slot
	if e != nil {
		writeError(w, e)
		return
	}
	if !req.WithPieces {
		writeJSON(w, http.StatusOK, map[string]any{"tokens": ids}, s.cfg.WriteTimeout)
		return
	}
	out := make([]tokenPiece, len(ids))
	for i, id := range ids {
		p := s.sess.Tok.Piece(id, true)
		out[i] = tokenPiece{ID: id, Piece: p}
		if !utf8.ValidString(p) {
			b := make([]int, len(p))
			for j := range len(p) {
				b[j] = int(p[j])
			}
			out[i].Piece = b
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out}, s.cfg.WriteTimeout)
}

// tokenizeContent reads content (a string, or strings and ids) into ids.
func (s *Server) tokenizeContent(req tokenizeRequest) ([]int, *apiError) {
	raw := bytes.TrimSpace(req.Content)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("content", "\"content\" is required: the text to tokenize")
	}
	parseSpecial := req.ParseSpecial == nil || *req.ParseSpecial
	tok := s.sess.Tok
	ids := []int{}
	// As llama-server's tokenize_mixed: only the first element, when it
	// is text, gets the special tokens the model wants around a prompt.
	encode := func(text string, first bool) {
		special := first && req.AddSpecial
		ids = append(ids, tok.Encode(text, special && tok.AddBOS(), parseSpecial)...)
		if special && tok.AddEOS() && tok.EOS() >= 0 {
			ids = append(ids, tok.EOS())
		}
	}
	var parts []json.RawMessage
	switch raw[0] {
	case '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, badRequest("content", "content: %v", err)
		}
		encode(text, true)
	case '[':
		if err := json.Unmarshal(raw, &parts); err != nil {
			return nil, badRequest("content", "content must be a string or an array of strings and token ids: %v", err)
		}
		for i, p := range parts {
			var text string
			if err := json.Unmarshal(p, &text); err == nil {
				encode(text, i == 0)
				continue
			}
			var id int
			if err := json.Unmarshal(p, &id); err != nil {
				return nil, badRequest("content", "content[%d] is %s: each element must be a string or a token id", i, p)
			}
			if id < 0 || id >= s.nVocab {
				return nil, badRequest("content", "content[%d] is token %d, outside the vocabulary of %d tokens", i, id, s.nVocab)
			}
			ids = append(ids, id)
		}
	default:
		return nil, badRequest("content", "content must be a string or an array of strings and token ids, got %s", raw)
	}
	return ids, nil
}

// detokenizeRequest is the body of POST /detokenize.
type detokenizeRequest struct {
	Tokens []int `json:"tokens"`
}

// handleDetokenize answers {"content": TEXT}: the pieces of the tokens
// joined, special tokens as their text, as llama-server renders them.
func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	var b []byte
	for i, id := range req.Tokens {
		if id < 0 || id >= s.nVocab {
			writeError(w, badRequest("tokens", "tokens[%d] is %d, outside the vocabulary of %d tokens", i, id, s.nVocab))
			return
		}
		b = append(b, s.sess.Tok.Piece(id, true)...)
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": string(b)}, s.cfg.WriteTimeout)
}

// handleProps answers GET /props: the server's defaults and model, in
// llama-server's shape (the fields that have a meaning in ats).
func (s *Server) handleProps(w http.ResponseWriter, r *http.Request) {
	def := s.cfg.Sampling
	seed := uint64(0xFFFFFFFF) // llama.cpp's "random seed"
	if def.Seed != 0 {
		seed = def.Seed
	}
	_, running := s.q.length()
	params := map[string]any{
		"n_predict":         -1,
		"max_tokens":        -1,
		"seed":              seed,
		"temperature":       def.Temperature,
		"top_k":             def.TopK,
		"top_p":             def.TopP,
		"min_p":             def.MinP,
		"repeat_last_n":     def.RepeatLastN,
		"repeat_penalty":    def.RepeatPenalty,
		"presence_penalty":  def.PresencePenalty,
		"frequency_penalty": def.FrequencyPenalty,
		"stop":              []string{},
		"n_keep":            0,
		"ignore_eos":        false,
		"stream":            false,
		"n_probs":           0,
		// ats's chain, in its order (runtime/text/sampler).
		"samplers": []string{"penalties", "logit_bias", "top_k", "top_p", "min_p", "temperature"},
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{
			"id":            0,
			"id_task":       -1,
			"n_ctx":         s.sess.CtxSize(),
			"speculative":   false,
			"is_processing": running > 0,
			"params":        params,
		},
		"total_slots":   s.cfg.Parallel,
		"kv_cache":      s.kvCacheProps(),
		"model_path":    s.sess.Model.File.Path,
		"model_alias":   s.cfg.ModelName,
		"chat_template": s.tmpl.Source(),
		"modalities":    map[string]bool{"vision": false, "audio": false},
		"build_info":    buildInfo(),
		"is_sleeping":   false,
	}, s.cfg.WriteTimeout)
}

// kvCacheProps describe the KV cache for /props: its type (llama.cpp's
// cache_type_k and _v), positions and bytes by device.
func (s *Server) kvCacheProps() map[string]any {
	kv := s.sess.KVCache()
	return map[string]any{"type_k": kv.Type.String(), "type_v": kv.Type.String(), "positions": kv.Rows,
		"bytes": kv.Bytes, "bytes_cpu": kv.HostBytes, "bytes_gpu": kv.DeviceBytes}
}

// buildInfo names the ats build: the module version and the commit it was
// built from, when the Go build recorded them.
func buildInfo() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "ats"
	}
	info := "ats " + bi.Main.Version
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && len(st.Value) >= 12 {
			info += " (" + st.Value[:12] + ")"
		}
	}
	return info
}
