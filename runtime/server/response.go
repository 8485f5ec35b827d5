package server

// Response bodies, in OpenAI's shapes. Fields OpenAI sends as null are
// pointers without omitempty; optional extras are omitempty.

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// timings is llama.cpp's extension: where the time went.
type timings struct {
	CacheN             int     `json:"cache_n"`
	PromptN            int     `json:"prompt_n"`
	PromptMS           float64 `json:"prompt_ms"`
	PromptPerSecond    float64 `json:"prompt_per_second"`
	PredictedN         int     `json:"predicted_n"`
	PredictedMS        float64 `json:"predicted_ms"`
	PredictedPerSecond float64 `json:"predicted_per_second"`
}

type functionOut struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type toolCallOut struct {
	Index    *int        `json:"index,omitempty"` // in stream deltas only
	ID       string      `json:"id"`
	Type     string      `json:"type"`
	Function functionOut `json:"function"`
}

type messageOut struct {
	Role             string        `json:"role"`
	Content          *string       `json:"content"` // null when the reply is only tool calls
	ReasoningContent string        `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type deltaOut struct {
	Role             string        `json:"role,omitempty"`
	Content          *string       `json:"content,omitempty"`
	ReasoningContent *string       `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallOut `json:"tool_calls,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *messageOut   `json:"message,omitempty"`
	Delta        *deltaOut     `json:"delta,omitempty"`
	FinishReason *string       `json:"finish_reason"`
	Logprobs     *chatLogprobs `json:"logprobs"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"` // chat.completion or chat.completion.chunk
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usage       `json:"usage,omitempty"`
	Timings           *timings     `json:"timings,omitempty"`
	// PromptProgress is llama-server's return_progress: chunks before
	// the text say how far the prompt's evaluation is.
	PromptProgress *promptProgress `json:"prompt_progress,omitempty"`
}

type completionChoice struct {
	Text         string              `json:"text"`
	Index        int                 `json:"index"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type textCompletion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"` // text_completion
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             *usage             `json:"usage,omitempty"`
	Timings           *timings           `json:"timings,omitempty"`
	// PromptProgress is llama-server's return_progress: chunks before
	// the text say how far the prompt's evaluation is.
	PromptProgress *promptProgress `json:"prompt_progress,omitempty"`
}

type modelOut struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Created int64          `json:"created"`
	OwnedBy string         `json:"owned_by"`
	Meta    map[string]any `json:"meta,omitempty"`
}

type modelList struct {
	Object string     `json:"object"`
	Data   []modelOut `json:"data"`
}

func strPtr(s string) *string { return &s }

// promptProgress is llama-server's prompt_progress: the prompt's tokens,
// those reused from the cache, those in the cache so far (reused ones
// included), and the time since the evaluation began.
type promptProgress struct {
	Total     int   `json:"total"`
	Cache     int   `json:"cache"`
	Processed int   `json:"processed"`
	TimeMS    int64 `json:"time_ms"`
}
