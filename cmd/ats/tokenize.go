package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// vocabTestSeparator separates the cases of a tokenizer test file, the
// format of llama.cpp's test-tokenizer-0 (*.inp) files.
const vocabTestSeparator = "\n__ggml_vocab_test__\n"

func init() { register(newTokenizeCmd) }

func newTokenizeCmd() *cobra.Command {
	var (
		modelPath, file      string
		special, bos, pieces bool
	)
	cmd := &cobra.Command{
		Use:   "tokenize MODEL [--file F | TEXT]",
		Short: "Print the token ids of a text",
		Long: `tokenize prints the token ids the model's tokenizer gives a text, the same
ids llama.cpp gives. The text is the argument, or standard input when there
is none.

With --file, the file holds test cases separated by a line
"__ggml_vocab_test__" (llama.cpp's *.inp format) and each case gives one line
of ids, each preceded by a space (the *.out format).

By default no BOS token is added and special tokens written in the text
(<|im_start|>) are tokenized as plain text.`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if modelPath == "" {
				return fmt.Errorf("tokenize: no model given: ats tokenize MODEL [TEXT] or -m MODEL")
			}
			if !cmd.Flags().Changed("model") && len(args) > 0 {
				args = args[1:] // the model came first
			}
			if len(args) > 1 {
				return fmt.Errorf("tokenize: give the text as one argument (quote it)")
			}
			if file != "" && len(args) > 0 {
				return fmt.Errorf("tokenize: give either --file or a text, not both")
			}
			tok, err := loadTokenizer(modelPath, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			if file != "" {
				data, err := os.ReadFile(file)
				if err != nil {
					return fmt.Errorf("tokenize: %w", err)
				}
				for _, c := range splitVocabCases(string(data)) {
					writeIDs(out, tok.Encode(c, bos, special))
				}
				return out.Flush()
			}
			var text string
			if len(args) == 1 {
				text = args[0]
			} else {
				data, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("tokenize: reading standard input: %w", err)
				}
				text = string(data)
			}
			ids := tok.Encode(text, bos, special)
			if pieces {
				for _, id := range ids {
					fmt.Fprintf(out, "%6d -> %s\n", id, strconv.Quote(tok.Piece(id, true)))
				}
			} else {
				writeIDs(out, ids)
			}
			return out.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVarP(&modelPath, "model", "m", "", "GGUF model (or vocabulary-only) file")
	f.StringVar(&file, "file", "", "tokenize each case of a llama.cpp *.inp test file")
	f.BoolVar(&special, "special", false, "parse special tokens written in the text (<|im_start|>, <s>, ...)")
	f.BoolVar(&bos, "bos", false, "add the BOS token in front")
	f.BoolVar(&pieces, "pieces", false, "print one token per line with its text")
	return cmd
}

// loadTokenizer reads the tokenizer of a GGUF file; warnings go to warnOut.
func loadTokenizer(path string, warnOut io.Writer) (*tokenizer.Tokenizer, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return tokenizer.FromGGUF(f, func(msg string) { fmt.Fprintln(warnOut, "ats: warning:", msg) })
}

// splitVocabCases splits an *.inp file; it ends with a separator, after
// which there is no case.
func splitVocabCases(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, vocabTestSeparator), vocabTestSeparator)
}

// writeIDs writes one line of ids, each preceded by a space.
func writeIDs(w io.Writer, ids []int) {
	var b []byte
	for _, id := range ids {
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, '\n')
	w.Write(b)
}
