package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
)

// say makes the server's model "generate" text, in small pieces, through
// the callbacks Generate would call, and records the rendered prompt.
func say(s *Server, text string, prompt *string) {
	s.testHookPrompt = func(p string) {
		if prompt != nil {
			*prompt = p
		}
	}
	s.gen = func(ctx context.Context, ids []int, opt session.GenerateOptions) (*session.GenerateResult, error) {
		res := &session.GenerateResult{PromptTokens: len(ids), StopReason: session.StopEOG}
		for rest := text; rest != ""; {
			n := min(len(rest), 3)
			if opt.OnToken != nil {
				opt.OnToken(0)
			}
			res.Tokens = append(res.Tokens, 0)
			if err := opt.OnText(rest[:n]); err != nil {
				return res, err
			}
			rest = rest[n:]
		}
		res.Text = text
		return res, nil
	}
}

var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name:        "get_weather",
	Description: openai.String("Current weather in a city"),
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required":   []string{"city"},
	},
})

const qwenToolReply = "<think>\nThe user wants the weather in Paris.\n</think>\n\n" +
	"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

// TestToolCallsAndReasoning runs a Qwen3-style reply with reasoning and a
// tool call through the server, streamed and not, with the OpenAI client.
func TestToolCallsAndReasoning(t *testing.T) {
	var prompt string
	// The tool prompt is long in the oracle's made-up vocabulary; the
	// fake generation needs no cache, so a large context costs little.
	ts := startServerCtx(t, 2048, Config{}, func(s *Server) { say(s, qwenToolReply, &prompt) })
	if ts.ToolFormat() != FormatHermes {
		t.Fatalf("format %v", ts.ToolFormat())
	}
	ctx := context.Background()
	p := ts.chatParams("What's the weather in Paris?", 100)
	p.Tools = []openai.ChatCompletionToolUnionParam{weatherTool}

	resp, err := ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// The tools reached the template.
	if !strings.Contains(prompt, "<tools>") || !strings.Contains(prompt, `"name": "get_weather"`) {
		t.Errorf("tools missing from the prompt:\n%s", prompt)
	}
	c := resp.Choices[0]
	if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
		t.Fatalf("choice %s", c.RawJSON())
	}
	tc := c.Message.ToolCalls[0]
	if tc.Type != "function" || tc.Function.Name != "get_weather" || tc.Function.Arguments != `{"city":"Paris"}` || !strings.HasPrefix(tc.ID, "call_") {
		t.Errorf("tool call %s", tc.RawJSON())
	}
	var raw struct {
		Choices []struct {
			Message map[string]any `json:"message"`
		} `json:"choices"`
	}
	json.Unmarshal([]byte(resp.RawJSON()), &raw)
	msg := raw.Choices[0].Message
	if content, ok := msg["content"]; !ok || content != nil {
		t.Errorf("content is %v, want null", content)
	}
	if msg["reasoning_content"] != "The user wants the weather in Paris." {
		t.Errorf("reasoning_content %q", msg["reasoning_content"])
	}

	// Streamed: reasoning deltas, then the call, then finish_reason.
	stream := ts.client.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	var reasoning, content strings.Builder
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		if len(ch.Choices) == 0 {
			continue
		}
		d := ch.Choices[0].Delta
		content.WriteString(d.Content)
		if f, ok := d.JSON.ExtraFields["reasoning_content"]; ok && f.Raw() != "" {
			var s string
			json.Unmarshal([]byte(f.Raw()), &s)
			reasoning.WriteString(s)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if reasoning.String() != "The user wants the weather in Paris." || content.String() != "" {
		t.Errorf("streamed reasoning %q, content %q", reasoning.String(), content.String())
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city":"Paris"}` || acc.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("accumulated %+v, finish %q", calls, acc.Choices[0].FinishReason)
	}

	// The next turn carries the call and its result back.
	p.Messages = append(p.Messages,
		openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
			ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID: tc.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: tc.Function.Arguments}}}},
		}},
		openai.ToolMessage("18 degrees and sunny", tc.ID))
	say(ts.Server, "It is 18 degrees and sunny in Paris.", &prompt)
	resp, err = ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Choices[0].Message.Content != "It is 18 degrees and sunny in Paris." || resp.Choices[0].FinishReason != "stop" {
		t.Errorf("answer %s", resp.Choices[0].RawJSON())
	}
	if !strings.Contains(prompt, "<tool_response>\n18 degrees and sunny\n</tool_response>") || !strings.Contains(prompt, `{"name": "get_weather", "arguments": {"city": "Paris"}}`) {
		t.Errorf("history missing from the prompt:\n%s", prompt)
	}

	// tool_choice "none": the tools stay out, and a <tool_call> in the
	// reply is just text.
	say(ts.Server, qwenToolReply, &prompt)
	p = ts.chatParams("What's the weather in Paris?", 100)
	p.Tools = []openai.ChatCompletionToolUnionParam{weatherTool}
	p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	resp, err = ts.client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(prompt, "<tools>") || len(resp.Choices[0].Message.ToolCalls) != 0 || !strings.Contains(resp.Choices[0].Message.Content, "<tool_call>") {
		t.Errorf("tool_choice none: %s\nprompt %s", resp.Choices[0].RawJSON(), prompt)
	}
}

// TestOtherToolFormats runs Llama 3 and GLM-4 replies through the server.
func TestOtherToolFormats(t *testing.T) {
	for _, c := range []struct {
		format ToolFormat
		reply  string
	}{
		{FormatLlama3, `{"name": "get_weather", "parameters": {"city": "Paris"}}`},
		{FormatGLM4, "<think>Weather: use the tool.</think>\nget_weather\n{\"city\": \"Paris\"}"},
	} {
		t.Run(c.format.String(), func(t *testing.T) {
			ts := startServerCtx(t, 2048, Config{}, func(s *Server) {
				s.format = c.format
				say(s, c.reply, nil)
			})
			p := ts.chatParams("weather?", 100)
			p.Tools = []openai.ChatCompletionToolUnionParam{weatherTool}
			for _, streamed := range []bool{false, true} {
				var msg openai.ChatCompletionMessage
				var finish string
				if streamed {
					stream := ts.client.Chat.Completions.NewStreaming(context.Background(), p)
					var acc openai.ChatCompletionAccumulator
					for stream.Next() {
						acc.AddChunk(stream.Current())
					}
					if err := stream.Err(); err != nil {
						t.Fatal(err)
					}
					msg, finish = acc.Choices[0].Message, acc.Choices[0].FinishReason
				} else {
					resp, err := ts.client.Chat.Completions.New(context.Background(), p)
					if err != nil {
						t.Fatal(err)
					}
					msg, finish = resp.Choices[0].Message, resp.Choices[0].FinishReason
				}
				if finish != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || msg.Content != "" {
					t.Errorf("streamed %v: finish %q, message %+v", streamed, finish, msg)
				}
			}
		})
	}
}

// TestThinkingOff checks that chat_template_kwargs and reasoning_effort
// reach the template.
func TestThinkingOff(t *testing.T) {
	var prompt string
	ts := startServer(t, Config{}, func(s *Server) { say(s, "ok", &prompt) })
	body := func(extra string) string {
		return `{"messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	for _, extra := range []string{`,"chat_template_kwargs":{"enable_thinking":false}`, `,"reasoning_effort":"none"`} {
		status, e, _ := do(t, "POST", ts.url+"/v1/chat/completions", body(extra))
		if status != 200 {
			t.Fatalf("%s: %d %+v", extra, status, e)
		}
		// The ChatML fallback has no enable_thinking; what matters is
		// that the variable arrives, which the synthetic Qwen3 test checks
		// on the real template. Here: no error, and the prompt rendered.
		if !strings.Contains(prompt, "hi") {
			t.Errorf("prompt %q", prompt)
		}
	}
}
