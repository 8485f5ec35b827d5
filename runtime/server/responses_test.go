package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// The Responses API through OpenAI's Go SDK: text, streamed events,
// function tools and previous_response_id.

func TestResponsesText(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{})
	ctx := context.Background()
	params := responses.ResponseNewParams{
		Model:           "tiny",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello there")},
		Instructions:    openai.String("Answer briefly."),
		MaxOutputTokens: openai.Int(10),
		Temperature:     openai.Float(0),
	}
	resp, err := ts.client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.ID, "resp_") || resp.Object != "response" || resp.OutputText() == "" {
		t.Fatalf("response %s", resp.RawJSON())
	}
	if resp.Usage.InputTokens == 0 || resp.Usage.OutputTokens == 0 || resp.Usage.TotalTokens != resp.Usage.InputTokens+resp.Usage.OutputTokens {
		t.Errorf("usage %s", resp.Usage.RawJSON())
	}
	if resp.Usage.OutputTokens == 10 && (resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens") {
		t.Errorf("cut off at max_output_tokens: status %q %s", resp.Status, resp.IncompleteDetails.RawJSON())
	}

	// Streamed: the deltas add up to the same text, and the last event
	// carries the whole response.
	stream := ts.client.Responses.NewStreaming(ctx, params)
	var text strings.Builder
	var last responses.Response
	var types []string
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			last = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != resp.OutputText() || last.OutputText() != resp.OutputText() {
		t.Errorf("streamed %q, final event %q, whole %q", text.String(), last.OutputText(), resp.OutputText())
	}
	if types[0] != "response.created" || !strings.Contains(strings.Join(types, " "), "response.output_item.done") {
		t.Errorf("events %v", types)
	}

	// A stored response can be read back and continued.
	got, err := ts.client.Responses.Get(ctx, resp.ID, responses.ResponseGetParams{})
	if err != nil || got.OutputText() != resp.OutputText() {
		t.Fatalf("get: %v", err)
	}
	var prompt string
	ts.Server.testHookPrompt = func(p string) { prompt = p }
	params.Input = responses.ResponseNewParamsInputUnion{OfString: openai.String("And again?")}
	params.PreviousResponseID = openai.String(resp.ID)
	if _, err := ts.client.Responses.New(ctx, params); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Hello there", resp.OutputText(), "And again?"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("the continued prompt lacks %q:\n%s", want, prompt)
		}
	}
	params.PreviousResponseID = openai.String("resp_nosuch")
	_, err = ts.client.Responses.New(ctx, params)
	var apiErr *openai.Error
	if !asAPIErr(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "previous_response_id" {
		t.Errorf("unknown previous_response_id: %v", err)
	}
	// store false keeps nothing.
	params.PreviousResponseID = openai.String("")
	params.Store = openai.Bool(false)
	unstored, err := ts.client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.client.Responses.Get(ctx, unstored.ID, responses.ResponseGetParams{}); !asAPIErr(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("an unstored response was found: %v", err)
	}
}

func asAPIErr(err error, target **openai.Error) bool {
	if err == nil {
		return false
	}
	e, ok := err.(*openai.Error)
	if ok {
		*target = e
	}
	return ok
}

func TestResponsesTools(t *testing.T) {
	var prompt string
	ts := startServerCtx(t, 2048, Config{}, func(s *Server) { say(s, qwenToolReply, &prompt) })
	ctx := context.Background()
	tool := responses.ToolParamOfFunction("get_weather", map[string]any{
		"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}}, true)
	params := responses.ResponseNewParams{Model: "tiny", Tools: []responses.ToolUnionParam{tool},
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather in Paris?")}}
	check := func(name string, r *responses.Response) string {
		t.Helper()
		var call responses.ResponseOutputItemUnion
		kinds := []string{}
		for _, it := range r.Output {
			kinds = append(kinds, it.Type)
			if it.Type == "function_call" {
				call = it
			}
		}
		if fmt.Sprint(kinds) != "[reasoning function_call]" || call.Name != "get_weather" || call.Arguments.OfString != `{"city":"Paris"}` || call.CallID == "" {
			t.Fatalf("%s: output %v: %s", name, kinds, r.RawJSON())
		}
		return call.CallID
	}
	resp, err := ts.client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	callID := check("whole", resp)
	stream := ts.client.Responses.NewStreaming(ctx, params)
	var final responses.Response
	for stream.Next() {
		if ev := stream.Current(); ev.Type == "response.completed" {
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	check("streamed", &final)

	// The result goes back with previous_response_id.
	say(ts.Server, "It is sunny.", &prompt)
	next, err := ts.client.Responses.New(ctx, responses.ResponseNewParams{Model: "tiny", Tools: params.Tools,
		PreviousResponseID: openai.String(resp.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{CallID: openai.String(callID),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("18 degrees")}}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if next.OutputText() != "It is sunny." {
		t.Errorf("second turn %s", next.RawJSON())
	}
	if !strings.Contains(prompt, "Weather in Paris?") || !strings.Contains(prompt, `"name": "get_weather"`) || !strings.Contains(prompt, "<tool_response>\n18 degrees") {
		t.Errorf("the conversation is not in the prompt:\n%s", prompt)
	}
}

// The store keeps the latest responses within its bounds.
func TestResponseStoreBound(t *testing.T) {
	var st responseStore
	for i := range maxStoredResponses + 10 {
		st.put(fmt.Sprint(i), &storedResponse{body: []byte("{}")})
	}
	if _, ok := st.get("0"); ok {
		t.Error("the oldest response was kept past the bound")
	}
	if _, ok := st.get(fmt.Sprint(maxStoredResponses + 9)); !ok || len(st.order) != maxStoredResponses {
		t.Errorf("kept %d", len(st.order))
	}
	st.put("big", &storedResponse{body: make([]byte, maxStoredBytes)})
	if st.bytes > maxStoredBytes {
		t.Errorf("%d bytes kept, bound %d", st.bytes, maxStoredBytes)
	}
}
