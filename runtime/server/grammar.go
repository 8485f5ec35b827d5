package server

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/atsinfer/ats/runtime/text/constrain"
)

// llama-server's constraint fields: "grammar" (GBNF text) and a top-level
// "json_schema" (the schema itself). Both compile into the same automaton
// as response_format (runtime/text/constrain), with the same masks and the
// same cache of compiled constraints.

// constraintRequest is what a request asks to constrain its reply with:
// at most one of a GBNF grammar, a JSON schema, or any JSON object.
type constraintRequest struct {
	param     string // the field that asked for it, for errors
	grammar   string
	schema    json.RawMessage
	anyObject bool
}

func (c constraintRequest) none() bool { return c.grammar == "" && c.schema == nil && !c.anyObject }

// requestConstraint reads response_format, grammar and json_schema, of
// which at most one may be given.
func requestConstraint(rf *json.RawMessage, grammar *string, jsonSchema json.RawMessage) (constraintRequest, *apiError) {
	var out constraintRequest
	var given []string
	schema, anyObject, e := responseFormat(rf)
	if e != nil {
		return out, e
	}
	if schema != nil || anyObject {
		out = constraintRequest{param: "response_format", schema: schema, anyObject: anyObject}
		given = append(given, "response_format")
	}
	if grammar != nil && strings.TrimSpace(*grammar) != "" {
		out = constraintRequest{param: "grammar", grammar: *grammar}
		given = append(given, "grammar")
	}
	if js := bytes.TrimSpace(jsonSchema); len(js) > 0 && !bytes.Equal(js, []byte("null")) {
		if js[0] != '{' && !bytes.Equal(js, []byte("true")) {
			return out, badRequest("json_schema", "json_schema must be a JSON Schema object")
		}
		out = constraintRequest{param: "json_schema", schema: js}
		if bytes.Equal(js, []byte("{}")) || bytes.Equal(js, []byte("true")) {
			out = constraintRequest{param: "json_schema", anyObject: true}
		}
		given = append(given, "json_schema")
	}
	if len(given) > 1 {
		return out, badRequest(given[1], "%s cannot be combined with %s: give one constraint", strings.Join(given[1:], " and "), given[0])
	}
	return out, nil
}

// requestConstraintFor builds the constraint a request asked for, or nil.
func (s *Server) requestConstraintFor(c constraintRequest, think thinkMode) (*constrain.Constraint, *apiError) {
	if c.grammar == "" {
		con, e := s.formatConstraint(c.schema, c.anyObject, think)
		if e != nil && e.Param != nil && *e.Param == "response_format" && c.param != "response_format" {
			e.Param = &c.param
			e.Message = strings.Replace(e.Message, "response_format", c.param, 1)
		}
		return con, e
	}
	key := "gbnf|" + think.key() + "|" + c.grammar
	con, err := s.constraint(key, func() (constrain.Expr, error) {
		root, err := constrain.ParseGBNF(c.grammar)
		if err != nil {
			return constrain.Expr{}, err
		}
		if think == thinkSkip {
			return root, nil // the grammar says exactly what the reply is
		}
		return think.expr(root), nil
	})
	if err != nil {
		return nil, constraintError("grammar", err)
	}
	return con, nil
}

// A field ats knows but cannot honour is refused with a 400 that names it,
// unless its value is the one that changes nothing (clients that send
// every setting send those). Fields nobody needs honoured (user,
// metadata, store, ...) are ignored, as OpenAI-compatible servers do.
type unsupportedField struct {
	neutral func(raw json.RawMessage) bool // the value that changes nothing, if any
	why     string
}

func isNumber(v float64) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var f float64
		return json.Unmarshal(raw, &f) == nil && f == v
	}
}

func isBool(v bool) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var b bool
		return json.Unmarshal(raw, &b) == nil && b == v
	}
}

func isEmpty(raw json.RawMessage) bool {
	t := string(bytes.TrimSpace(raw))
	return t == "null" || t == "[]" || t == "{}" || t == `""`
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// samplerFields are llama-server's sampling settings ats does not have.
var samplerFields = map[string]unsupportedField{
	"mirostat":              {isNumber(0), "ats has no mirostat sampler"},
	"mirostat_tau":          {nil, "ats has no mirostat sampler"},
	"mirostat_eta":          {nil, "ats has no mirostat sampler"},
	"typical_p":             {isNumber(1), "ats has no typical sampler"},
	"tfs_z":                 {isNumber(1), "ats has no tail-free sampler"},
	"top_n_sigma":           {isNumber(-1), "ats has no top-n-sigma sampler"},
	"dynatemp_range":        {isNumber(0), "ats has no dynamic temperature"},
	"dynatemp_exponent":     {nil, "ats has no dynamic temperature"},
	"xtc_probability":       {isNumber(0), "ats has no XTC sampler"},
	"xtc_threshold":         {nil, "ats has no XTC sampler"},
	"dry_multiplier":        {isNumber(0), "ats has no DRY sampler"},
	"dry_base":              {nil, "ats has no DRY sampler"},
	"dry_allowed_length":    {nil, "ats has no DRY sampler"},
	"dry_penalty_last_n":    {nil, "ats has no DRY sampler"},
	"dry_sequence_breakers": {nil, "ats has no DRY sampler"},
	"samplers":              {nil, "ats's sampler order is fixed (see GET /props)"},
	"min_keep":              {isNumber(0), "ats's samplers keep no minimum"},
	"n_keep":                {isNumber(0), "ats refuses a prompt that does not fit instead of cutting it"},
	"n_discard":             {isNumber(0), "ats does not shift the context"},
	"n_probs":               {isNumber(0), "use logprobs and top_logprobs"},
	"post_sampling_probs":   {isBool(false), "ats reports the model's own probabilities"},
	"penalize_nl":           {isBool(false), "ats's penalties treat a newline as any token"},
	"grammar_lazy":          {isBool(false), "ats applies a grammar from the first token"},
	"grammar_triggers":      {isEmpty, "ats applies a grammar from the first token"},
	"preserved_tokens":      {isEmpty, "ats has no preserved tokens"},
	"lora":                  {isEmpty, "ats serves no LoRA adapters"},
	"image_data":            {isEmpty, "ats serves text-only models"},
	"id_slot":               {isNumber(-1), "ats gives each request the slot whose cache it can reuse most"},
	"t_max_predict_ms":      {isNumber(0), "use max_tokens"},
	"cache_prompt":          {isBool(true), "ats always reuses the cached prefix"},
	"n_cmpl":                {isNumber(1), "ats generates one choice per request"},
}

// chatFields are OpenAI's chat fields ats cannot honour.
var chatFields = map[string]unsupportedField{
	"audio":              {isNull, "ats serves text-only models"},
	"modalities":         {func(raw json.RawMessage) bool { return isNull(raw) || strings.TrimSpace(string(raw)) == `["text"]` }, "ats answers in text only"},
	"prediction":         {isNull, "ats has no predicted outputs"},
	"web_search_options": {isNull, "ats cannot search the web"},
	"functions":          {isEmpty, "use tools"},
	"function_call":      {isNull, "use tool_choice"},
}

// checkUnsupported refuses the fields of body in tables whose value is not
// neutral.
func checkUnsupported(body []byte, tables ...map[string]unsupportedField) *apiError {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return nil // the typed decoding reports what is wrong
	}
	// Report the first by name, so the answer does not vary.
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		for _, t := range tables {
			f, ok := t[name]
			if !ok {
				continue
			}
			if f.neutral != nil && f.neutral(fields[name]) || f.neutral == nil && isNull(fields[name]) {
				continue
			}
			return badRequest(name, "%s is not supported: %s", name, f.why)
		}
	}
	return nil
}

// nPredict applies llama-server's n_predict where max_tokens is not given.
func nPredict(max *int, n *int) *int {
	if max != nil || n == nil {
		return max
	}
	return n
}
