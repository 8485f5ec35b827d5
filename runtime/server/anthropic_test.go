package server

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/atsinfer/ats/runtime/session"
)

// The Messages API, through Anthropic's own Go SDK.

func anthropicClient(ts *testServer, key string) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(ts.url+"/"), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
}

func TestAnthropicMessages(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{APIKey: "sekrit"})
	client := anthropicClient(ts, "sekrit") // sent as x-api-key
	ctx := context.Background()
	params := anthropic.MessageNewParams{
		Model:     "tiny",
		MaxTokens: 12,
		System:    []anthropic.TextBlockParam{{Text: "Answer briefly."}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hello there"))},
	}
	greedy := aoption.WithJSONSet("temperature", 0)
	msg, err := client.Messages.New(ctx, params, greedy)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Role != "assistant" || msg.Type != "message" || !strings.HasPrefix(msg.ID, "msg_") || len(msg.Content) == 0 {
		t.Fatalf("message %s", msg.RawJSON())
	}
	if msg.StopReason != anthropic.StopReasonMaxTokens && msg.StopReason != anthropic.StopReasonEndTurn {
		t.Errorf("stop reason %q", msg.StopReason)
	}
	if msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
		t.Errorf("usage %s", msg.Usage.RawJSON())
	}
	var text string
	for _, b := range msg.Content {
		if b.Type == "text" {
			text += b.Text
		}
	}

	// Streamed, the events add up to the same message.
	stream := client.Messages.NewStreaming(ctx, params, greedy)
	var acc anthropic.Message
	var events []string
	for stream.Next() {
		ev := stream.Current()
		events = append(events, ev.Type)
		if err := acc.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	var streamed string
	for _, b := range acc.Content {
		if b.Type == "text" {
			streamed += b.Text
		}
	}
	if streamed != text || acc.StopReason != msg.StopReason {
		t.Errorf("streamed %q (%s), whole %q (%s)", streamed, acc.StopReason, text, msg.StopReason)
	}
	if events[0] != "message_start" || events[len(events)-1] != "message_stop" || events[len(events)-2] != "message_delta" {
		t.Errorf("events %v", events)
	}

	// A wrong key is refused; count_tokens counts the prompt.
	wrong := anthropicClient(ts, "wrong")
	if _, err := wrong.Messages.New(ctx, params); err == nil {
		t.Error("a wrong x-api-key was accepted")
	}
	n, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "tiny",
		Messages: params.Messages, System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: params.System}})
	if err != nil {
		t.Fatal(err)
	}
	if n.InputTokens != msg.Usage.InputTokens+msg.Usage.CacheReadInputTokens {
		t.Errorf("count_tokens %d, message's input %d+%d", n.InputTokens, msg.Usage.InputTokens, msg.Usage.CacheReadInputTokens)
	}

	// Errors in Anthropic's shape, with the field.
	_, err = client.Messages.New(ctx, anthropic.MessageNewParams{Model: "tiny", MaxTokens: 5,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewImageBlockBase64("image/png", "AAAA"))}})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Error(), "text-only") ||
		!strings.Contains(apiErr.RawJSON(), `"type":"invalid_request_error"`) {
		t.Errorf("an image: %v", err)
	}
}

// A stop sequence ends the reply and is named.
func TestAnthropicStopSequence(t *testing.T) {
	ts := startServerCtx(t, 1024, Config{}, func(s *Server) { say(s, "one two three", nil) })
	client := anthropicClient(ts, "x")
	// The fake generation does not stop by itself; the server's stop
	// matcher is in Generate, so this checks the mapping with a result
	// that says a stop string matched.
	ts.Server.gen = func(ctx context.Context, ids []int, opt session.GenerateOptions) (*session.GenerateResult, error) {
		opt.OnText("one two")
		return &session.GenerateResult{PromptTokens: len(ids), Tokens: []int{1, 2}, StopReason: "stop", StopString: " three"}, nil
	}
	msg, err := client.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "tiny", MaxTokens: 20,
		StopSequences: []string{" three"},
		Messages:      []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("count"))}})
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != anthropic.StopReasonStopSequence || msg.StopSequence != " three" || msg.Content[0].Text != "one two" {
		t.Errorf("message %s", msg.RawJSON())
	}
}

// Thinking blocks, tool use and tool results, both ways.
func TestAnthropicToolsAndThinking(t *testing.T) {
	var prompt string
	ts := startServerCtx(t, 2048, Config{}, func(s *Server) { say(s, qwenToolReply, &prompt) })
	client := anthropicClient(ts, "x")
	ctx := context.Background()
	tool := anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
		Name: "get_weather", Description: anthropic.String("Current weather in a city"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}, Required: []string{"city"}},
	}}
	params := anthropic.MessageNewParams{
		Model: "tiny", MaxTokens: 100, Tools: []anthropic.ToolUnionParam{tool},
		Thinking: anthropic.ThinkingConfigParamOfEnabled(1024),
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Weather in Paris?"))},
	}
	check := func(name string, m anthropic.Message) {
		t.Helper()
		if m.StopReason != anthropic.StopReasonToolUse || len(m.Content) != 2 {
			t.Fatalf("%s: %s", name, m.RawJSON())
		}
		if m.Content[0].Type != "thinking" || m.Content[0].Thinking != "The user wants the weather in Paris." {
			t.Errorf("%s: thinking %s", name, m.Content[0].RawJSON())
		}
		tu := m.Content[1]
		var input map[string]string
		json.Unmarshal(tu.Input, &input)
		if tu.Type != "tool_use" || tu.Name != "get_weather" || input["city"] != "Paris" || !strings.HasPrefix(tu.ID, "toolu_") {
			t.Errorf("%s: tool use %s", name, tu.RawJSON())
		}
	}
	msg, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	check("whole", *msg)
	if !strings.Contains(prompt, `"name": "get_weather"`) || !strings.Contains(prompt, "Weather in Paris?") {
		t.Errorf("prompt:\n%s", prompt)
	}
	stream := client.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	check("streamed", acc)

	// The next turn sends the call back with its result: the template
	// sees the assistant's call and the tool's answer.
	tu := msg.Content[1]
	params.Messages = append(params.Messages, msg.ToParam(),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock(tu.ID, "18 degrees and sunny", false)))
	say(ts.Server, "It is 18 degrees and sunny in Paris.", &prompt)
	msg2, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if msg2.StopReason != anthropic.StopReasonEndTurn || msg2.Content[0].Text != "It is 18 degrees and sunny in Paris." {
		t.Errorf("second turn %s", msg2.RawJSON())
	}
	if !strings.Contains(prompt, "<tool_response>\n18 degrees and sunny") || !strings.Contains(prompt, `"name": "get_weather"`) {
		t.Errorf("the tool result is not in the prompt:\n%s", prompt)
	}
}
