package server

import (
	"errors"
	"strings"

	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// render applies the chat template. The template was loaded by New and is
// safe for concurrent use, so requests render while they wait for the
// model. The messages' control-token texts are noted in the prompt, for
// encodePrompt (issue 33): a client that writes <|im_start|>system in a
// message gets those characters, not a system turn.
//
// Every endpoint that takes a conversation renders it with render and
// tokenizes it with encodePrompt.
func (s *Server) render(msgs []chat.Message, opt chat.Options) (chat.Prompt, error) {
	tok := s.sess.Tok
	if tok.BOS() >= 0 {
		opt.BOS = tok.TokenText(tok.BOS())
	}
	if tok.EOS() >= 0 {
		opt.EOS = tok.TokenText(tok.EOS())
	}
	opt.Tokenizer = tok
	return s.tmpl.RenderPrompt(msgs, opt)
}

// encodePrompt tokenizes a rendered conversation: the template's control
// tokens are parsed, the messages' are not. A prompt the context cannot
// hold with room for one generated token is refused as soon as that is
// known: by its length in bytes before any work (a token covers at most
// tokenizer.MaxTokenBytes of them), else once its tokens pass the
// context, so neither the prompt nor the tokenizer's memory can outgrow
// what the context holds.
func (s *Server) encodePrompt(p chat.Prompt) ([]int, *apiError) {
	ids, err := chat.EncodePrompt(s.sess.Tok, p, s.sess.CtxSize()-1)
	s.noteWork(len(p.Text))
	if err != nil {
		return nil, s.tooLong(err, "messages")
	}
	return ids, nil
}

// encodeText tokenizes a prompt the client wrote whole (/v1/completions):
// control tokens in it are parsed, as llama-server does, since the client
// writes the template's markers itself. It is bounded like encodePrompt.
func (s *Server) encodeText(text, param string) ([]int, *apiError) {
	tok := s.sess.Tok
	addBOS := tok.AddBOS() && tok.BOS() >= 0 && !strings.HasPrefix(text, tok.TokenText(tok.BOS()))
	ids, err := tok.EncodeWith(text, tokenizer.EncodeOptions{AddBOS: addBOS, ParseSpecial: true, MaxTokens: s.sess.CtxSize() - 1})
	s.noteWork(len(text))
	if err != nil {
		return nil, s.tooLong(err, param)
	}
	return ids, nil
}

// tooLong explains an encoding error: a prompt longer than the context.
func (s *Server) tooLong(err error, param string) *apiError {
	var tm *tokenizer.TooManyTokensError
	if !errors.As(err, &tm) {
		return internalError(err)
	}
	ctx := s.sess.CtxSize()
	return withCode(badRequest(param, "the prompt (%d bytes) needs more than %d tokens, but the context holds %d (and needs room for at least one generated token); shorten the prompt or start the server with a larger --ctx-size", tm.Bytes, tm.Max, ctx), "context_length_exceeded")
}
