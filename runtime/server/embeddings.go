package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/atsinfer/ats/runtime/session"
)

// Embeddings: POST /v1/embeddings (OpenAI's shape) and ollama's /api/embed
// and /api/embeddings, when the server runs with --embeddings. Each input
// is tokenized as the model wants a text (BOS and EOS where its tokenizer
// adds them; special tokens written in the text stay text), evaluated from
// position 0, and its final hidden states pooled as the model file says
// (mean, the first token's or the last token's), then scaled to unit
// length as OpenAI's are. Inputs take turns on the model with the chat
// requests, one batch of inputs per turn.

// maxEmbedInputs bounds the inputs of one request.
const maxEmbedInputs = 2048

type embeddingsRequest struct {
	Input          json.RawMessage `json:"input"`
	Model          string          `json:"model"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embedInputs reads input: a string, an array of strings, an array of
// token ids, or an array of arrays of token ids.
func (s *Server) embedInputs(raw json.RawMessage, param string) ([][]int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isNull(raw) {
		return nil, badRequest(param, "%s is missing", param)
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return s.embedTexts([]string{one}, param)
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		return s.embedTexts(texts, param)
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return s.embedIDs([][]int{ids}, param)
	}
	var many [][]int
	if json.Unmarshal(raw, &many) == nil {
		return s.embedIDs(many, param)
	}
	return nil, badRequest(param, "%s must be a string, an array of strings, an array of token ids or an array of such arrays", param)
}

func (s *Server) embedTexts(texts []string, param string) ([][]int, *apiError) {
	if len(texts) == 0 || len(texts) > maxEmbedInputs {
		return nil, badRequest(param, "%s has %d inputs; send 1 to %d", param, len(texts), maxEmbedInputs)
	}
	out := make([][]int, len(texts))
	for i, t := range texts {
		if t == "" {
			return nil, badRequest(param, "%s[%d] is empty", param, i)
		}
		out[i] = s.sess.EmbedTokens(t)
	}
	return s.checkEmbedLengths(out, param)
}

func (s *Server) embedIDs(in [][]int, param string) ([][]int, *apiError) {
	if len(in) == 0 || len(in) > maxEmbedInputs {
		return nil, badRequest(param, "%s has %d inputs; send 1 to %d", param, len(in), maxEmbedInputs)
	}
	for i, ids := range in {
		if len(ids) == 0 {
			return nil, badRequest(param, "%s[%d] is empty", param, i)
		}
		for _, id := range ids {
			if id < 0 || id >= s.nVocab {
				return nil, badRequest(param, "%s[%d] has token %d, outside the vocabulary of %d", param, i, id, s.nVocab)
			}
		}
	}
	return s.checkEmbedLengths(in, param)
}

func (s *Server) checkEmbedLengths(in [][]int, param string) ([][]int, *apiError) {
	ctx := s.sess.CtxSize()
	for i, ids := range in {
		if len(ids) > ctx {
			return nil, withCode(badRequest(param, "%s[%d] has %d tokens, but the context holds %d; shorten it or start the server with a larger --ctx-size", param, i, len(ids), ctx), "context_length_exceeded")
		}
	}
	return in, nil
}

// embeddingsOff is the answer while the server runs without --embeddings.
func embeddingsOff() *apiError {
	return &apiError{Status: http.StatusNotImplemented, Type: typeInvalidRequest,
		Message: "this server was started without --embeddings; start it with ats serve MODEL --embeddings to serve embeddings"}
}

// embed computes the inputs' embeddings on a worker.
func (s *Server) embed(r *http.Request, inputs [][]int) ([][]float32, *apiError) {
	if s.pooling == session.PoolingUnset {
		return nil, badRequest("model", "the model file names no pooling (%s.pooling_type) and the server was given none: start it with --pooling mean, cls or last", s.sess.Model.Hyper().Arch)
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()
	out := make([][]float32, len(inputs))
	var runErr error
	j := &job{ctx: ctx}
	j.run = func() {
		// Between the scheduler's steps: the engine evaluates these
		// sequences of its own while the slots' requests wait.
		runErr = s.sched.Do(ctx, func(e *session.Engine) error {
			for i, ids := range inputs {
				var err error
				if out[i], err = e.Embed(ctx, ids, s.pooling, true); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := s.q.submit(j); err != nil {
		msg := fmt.Sprintf("the server is busy: %d requests are already waiting; try again shortly", s.cfg.QueueLimit)
		if errors.Is(err, errShuttingDown) {
			msg = "the server is shutting down"
		}
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: msg}
	}
	s.q.markReady(j)
	if !s.q.wait(j) {
		s.met.cancelled.Inc()
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the request was cancelled"}
	}
	if runErr != nil {
		return nil, s.errorFor(runErr)
	}
	return out, nil
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.Embeddings {
		writeError(w, embeddingsOff())
		return
	}
	var req embeddingsRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		writeError(w, badRequest("encoding_format", "encoding_format %q: use float or base64", req.EncodingFormat))
		return
	}
	inputs, vecs, e := s.embedRequest(r, req.Input, req.Dimensions)
	if e != nil {
		writeError(w, e)
		return
	}
	type item struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	data := make([]item, len(vecs))
	tokens := 0
	for i, v := range vecs {
		data[i] = item{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			data[i].Embedding = base64Floats(v)
		}
		tokens += len(inputs[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": s.cfg.ModelName,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}}, s.cfg.WriteTimeout)
}

// embedRequest is what /v1/embeddings and ollama's /api/embed share: the
// dimensions checked, the input field read and every input embedded (each
// endpoint writes the error in its own API's shape).
func (s *Server) embedRequest(r *http.Request, input json.RawMessage, dims *int) ([][]int, [][]float32, *apiError) {
	if n := s.sess.Model.Hyper().NEmbd; dims != nil && *dims != n {
		return nil, nil, badRequest("dimensions", "dimensions is %d, but this model's embeddings have %d; ats does not shorten them", *dims, n)
	}
	inputs, e := s.embedInputs(input, "input")
	if e != nil {
		return nil, nil, e
	}
	vecs, e := s.embed(r, inputs)
	if e != nil {
		return nil, nil, e
	}
	return inputs, vecs, nil
}

// base64Floats is OpenAI's base64 encoding: little-endian float32s.
func base64Floats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// handleOllamaEmbed answers /api/embed: {"input": string or strings} to
// {"embeddings": [[...]]}.
func (s *Server) handleOllamaEmbed(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	if !s.cfg.Embeddings {
		ollamaError(w, embeddingsOff())
		return
	}
	var req struct {
		Input      json.RawMessage `json:"input"`
		Truncate   *bool           `json:"truncate"`
		Dimensions *int            `json:"dimensions"`
		Options    json.RawMessage `json:"options"`
	}
	if e := s.readBody(w, r, &req); e != nil {
		ollamaError(w, e)
		return
	}
	if req.Truncate != nil && *req.Truncate {
		// ollama's default: cut inputs to the context. ats refuses an
		// input that does not fit instead (below), which only differs
		// for inputs longer than the context.
		req.Truncate = nil
	}
	inputs, vecs, e := s.embedRequest(r, req.Input, req.Dimensions)
	if e != nil {
		ollamaError(w, e)
		return
	}
	n := 0
	for _, ids := range inputs {
		n += len(ids)
	}
	writeJSON(w, http.StatusOK, map[string]any{"model": s.cfg.ModelName, "embeddings": vecs,
		"total_duration": time.Since(received).Nanoseconds(), "load_duration": 0, "prompt_eval_count": n}, s.cfg.WriteTimeout)
}

// handleOllamaEmbeddings answers the older /api/embeddings: {"prompt"} to
// {"embedding"}.
func (s *Server) handleOllamaEmbeddings(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.Embeddings {
		ollamaError(w, embeddingsOff())
		return
	}
	var req struct {
		Prompt string `json:"prompt"`
	}
	if e := s.readBody(w, r, &req); e != nil {
		ollamaError(w, e)
		return
	}
	inputs, e := s.embedTexts([]string{req.Prompt}, "prompt")
	if e != nil {
		ollamaError(w, e)
		return
	}
	vecs, e := s.embed(r, inputs)
	if e != nil {
		ollamaError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"embedding": vecs[0]}, s.cfg.WriteTimeout)
}
