package main

import (
	"bufio"
	"errors"
	"io"
	"strings"

	"github.com/chzyer/readline"
)

// errInterrupted is Ctrl-C at a prompt with text on it: drop the text and
// ask again.
var errInterrupted = errors.New("interrupted")

// lineSource gives lines of input. prompt is the prompt to show, if the
// source shows one.
type lineSource interface {
	readLine(prompt string) (string, error)
	close()
}

// turnReader assembles lines into turns: a line ending in \ continues on
// the next line, and a line starting with """ opens a block that runs to a
// line ending with """ (ollama's syntax).
type turnReader struct {
	src            lineSource
	prompt, second string
}

// readTurn returns the next turn, without the markers. It returns io.EOF
// at the end of the input, errInterrupted when the user pressed Ctrl-C at
// a prompt with something typed (the turn is dropped), and io.EOF for
// Ctrl-C on an empty prompt (the way out).
func (r *turnReader) readTurn() (string, error) {
	line, err := r.src.readLine(r.prompt)
	if err != nil {
		return line, err
	}
	if rest, ok := strings.CutPrefix(strings.TrimLeft(line, " \t"), `"""`); ok {
		// A block; it may close on its first line ("""one line""").
		if body, closed := strings.CutSuffix(rest, `"""`); closed && rest != "" {
			return body, nil
		}
		var b strings.Builder
		b.WriteString(rest)
		for {
			l, err := r.src.readLine(r.second)
			if err == io.EOF {
				// The input ended inside the block: send what there is.
				return strings.TrimPrefix(b.String(), "\n"), nil
			}
			if err != nil {
				return "", err
			}
			if body, closed := strings.CutSuffix(l, `"""`); closed {
				b.WriteString("\n" + body)
				return strings.Trim(b.String(), "\n"), nil
			}
			b.WriteString("\n" + l)
		}
	}
	var b strings.Builder
	for {
		body, more := strings.CutSuffix(line, `\`)
		b.WriteString(body)
		if !more {
			return b.String(), nil
		}
		b.WriteByte('\n')
		line, err = r.src.readLine(r.second)
		if err == io.EOF {
			return b.String(), nil
		}
		if err != nil {
			return "", err
		}
	}
}

// pipeSource reads lines from a pipe or a file: no prompts, no editing.
type pipeSource struct{ r *bufio.Reader }

func (p *pipeSource) readLine(string) (string, error) {
	line, err := p.r.ReadString('\n')
	if err == io.EOF && line != "" {
		err = nil // a last line without a newline
	}
	return strings.TrimRight(line, "\r\n"), err
}

func (p *pipeSource) close() {}

// termSource reads lines from a terminal with line editing and history.
type termSource struct {
	rl   *readline.Instance
	main string // the first-line prompt
}

func newTermSource(historyFile string) (*termSource, error) {
	rl, err := readline.NewEx(&readline.Config{
		Prompt:            ">>> ",
		HistoryFile:       historyFile,
		HistoryLimit:      1000,
		HistorySearchFold: true,
		InterruptPrompt:   "^C",
		EOFPrompt:         "",
	})
	if err != nil {
		return nil, err
	}
	return &termSource{rl: rl, main: ">>> "}, nil
}

func (t *termSource) readLine(prompt string) (string, error) {
	t.rl.SetPrompt(prompt)
	line, err := t.rl.Readline()
	if errors.Is(err, readline.ErrInterrupt) {
		// Ctrl-C on an empty first line quits, as in a shell; anywhere
		// else it drops what was typed.
		if line == "" && prompt == t.main {
			return "", io.EOF
		}
		return "", errInterrupted
	}
	return line, err
}

func (t *termSource) close() { t.rl.Close() }
