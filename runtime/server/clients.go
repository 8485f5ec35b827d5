package server

import (
	"net/http"
	"strings"

	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
)

// clientRoutes are the endpoints of the other clients' APIs: Anthropic's
// messages, OpenAI's responses and embeddings, and ollama's.
func (s *Server) clientRoutes() map[string]route {
	responses := route{http.MethodPost: s.handleResponses}
	embeddings := route{http.MethodPost: s.handleEmbeddings}
	return map[string]route{
		"/v1/messages":              {http.MethodPost: s.handleAnthropicMessages},
		"/v1/messages/count_tokens": {http.MethodPost: s.handleAnthropicCountTokens},
		"/v1/responses":             responses, "/responses": responses,
		"/v1/embeddings": embeddings, "/embeddings": embeddings,
		"/api/chat":       {http.MethodPost: s.handleOllamaChat},
		"/api/generate":   {http.MethodPost: s.handleOllamaGenerate},
		"/api/tags":       {http.MethodGet: s.handleOllamaTags},
		"/api/show":       {http.MethodPost: s.handleOllamaShow},
		"/api/ps":         {http.MethodGet: s.handleOllamaPS},
		"/api/version":    {http.MethodGet: s.handleOllamaVersion},
		"/api/embed":      {http.MethodPost: s.handleOllamaEmbed},
		"/api/embeddings": {http.MethodPost: s.handleOllamaEmbeddings},
	}
}

// clientPrefixRoute routes the paths with an id in them:
// /v1/responses/{id}.
func (s *Server) clientPrefixRoute(path string) (route, string, bool) {
	if id, ok := strings.CutPrefix(path, "/v1/responses/"); ok && id != "" && !strings.Contains(id, "/") {
		return route{http.MethodGet: s.handleStoredResponse, http.MethodDelete: s.handleStoredResponse}, "/responses/{id}", true
	}
	return nil, "", false
}

// resolvePooling is the pooling embeddings use: the server's setting, or
// the model file's.
func resolvePooling(setting string, m *model.Model) (session.Pooling, error) {
	if setting != "" {
		return session.ParsePooling(setting)
	}
	return session.FilePooling(m.File)
}
