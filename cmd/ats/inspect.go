package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/gguf"
)

func init() { register(newInspectCmd) }

func newInspectCmd() *cobra.Command {
	var asJSON, tensors, template bool
	cmd := &cobra.Command{
		Use:   "inspect MODEL [--json] [--tensors=false] [--template]",
		Short: "Show what a GGUF model holds: architecture, hyperparameters, tokenizer, tensors",
		Long: `inspect reads a GGUF file's header (the data stays mapped, so even a large
model opens at once) and prints its architecture, parameter count, file
type, every hyperparameter of the architecture, the tokenizer and its
special tokens, the other metadata, a table of tensors and the totals per
weight type. Give the first part of a split model
(NAME-00001-of-0000N.gguf) to see the whole model. MODEL is a file or the
name of a pulled model (ats list).

--template adds the chat template's text (ats show does too). --json prints one JSON object with the same content for scripts.
Tensor shapes are in ggml order: the row length comes first.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch len(args) {
			case 0:
				return fmt.Errorf("inspect: no model given: ats inspect MODEL (a .gguf file or a pulled model's name: ats list)")
			case 1:
				return nil
			}
			return fmt.Errorf("inspect: one model at a time: got %d arguments", len(args))
		},
		ValidArgsFunction: completeModelArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := resolveModel(args[0])
			if err != nil {
				return fmt.Errorf("inspect: %w", err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			r := inspectModel(f)
			out := cmd.OutOrStdout()
			if asJSON {
				if !tensors {
					r.Tensors = nil
				}
				if template {
					r.ChatTemplate.Text = r.ChatTemplate.text
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(r)
			}
			if err := r.writeText(out, tensors); err != nil {
				return err
			}
			if template {
				return r.writeTemplate(out, isTerminal(out))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	cmd.Flags().BoolVar(&tensors, "tensors", true, "list every tensor (totals per type are always shown)")
	cmd.Flags().BoolVar(&template, "template", false, "show the chat template's text")
	return cmd
}

// writeTemplate prints the chat template's text. On a terminal its
// control characters are made visible: the text comes from the file.
func (r *inspectReport) writeTemplate(out io.Writer, terminal bool) error {
	if !r.ChatTemplate.Present {
		_, err := fmt.Fprintln(out, "\nchat template text: none in the file (ats uses its built-in template for the architecture)")
		return err
	}
	text := r.ChatTemplate.text
	if terminal {
		text = visibleControls(text)
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	_, err := fmt.Fprintf(out, "\nchat template text (%d bytes):\n%s", r.ChatTemplate.Bytes, text)
	return err
}

// inspectReport is what inspect shows. Its JSON field names are a stable
// interface for scripts: add fields, never rename them.
type inspectReport struct {
	Path            string              `json:"path"`
	GGUFVersion     uint32              `json:"gguf_version"`
	SizeBytes       int64               `json:"size_bytes"`
	Parts           int                 `json:"parts"`
	PartPaths       []string            `json:"part_paths"`
	Alignment       uint64              `json:"alignment"`
	Architecture    string              `json:"architecture"`
	Name            string              `json:"name"`
	ParameterCount  uint64              `json:"parameter_count"`
	Parameters      string              `json:"parameters"` // human form: 751.6M, 14.8B
	FileType        *inspectFileType    `json:"file_type"`  // null when general.file_type is absent
	Hyperparameters map[string]any      `json:"hyperparameters"`
	hyper           []gguf.KV           // the same, in file order with full keys, for text
	Tokenizer       *inspectTokenizer   `json:"tokenizer"` // null when there is no tokenizer.* key
	ChatTemplate    inspectChatTemplate `json:"chat_template"`
	Metadata        []inspectKV         `json:"metadata"` // keys not shown elsewhere
	TensorCount     int                 `json:"tensor_count"`
	TensorBytes     uint64              `json:"tensor_bytes"`
	Tensors         []inspectTensor     `json:"tensors"` // null with --tensors=false
	Types           []inspectTypeTotal  `json:"types"`   // largest share first
}

type inspectFileType struct {
	ID   uint64 `json:"id"`
	Name string `json:"name"`
}

type inspectTokenizer struct {
	Model         string                  `json:"model"`
	Pre           string                  `json:"pre"`
	VocabSize     int                     `json:"vocab_size"`
	MergesCount   int                     `json:"merges_count"`
	SpecialTokens map[string]inspectToken `json:"special_tokens"`
	AddBOS        *bool                   `json:"add_bos"` // null when the file does not say
	AddEOS        *bool                   `json:"add_eos"`
}

type inspectToken struct {
	ID   int64  `json:"id"`
	Text string `json:"text"`
	// Valid is false when the id is not in the vocabulary.
	Valid bool `json:"valid"`
}

type inspectChatTemplate struct {
	Present bool   `json:"present"`
	Bytes   int    `json:"bytes"`
	Text    string `json:"text,omitempty"` // with --template
	text    string
}

type inspectKV struct {
	Key   string     `json:"key"`
	Type  string     `json:"type"`  // uint32, string, array[string], ...
	Value any        `json:"value"` // the value; for long arrays {"length": n}
	raw   gguf.Value // for text
}

type inspectTensor struct {
	Name  string   `json:"name"`
	Type  string   `json:"type"`
	Shape []uint64 `json:"shape"` // ggml order: shape[0] is the row length
	Bytes uint64   `json:"bytes"`
	Part  int      `json:"part"` // 1-based file of a split model
}

type inspectTypeTotal struct {
	Type     string  `json:"type"`
	Count    int     `json:"count"`
	Elements uint64  `json:"elements"`
	Bytes    uint64  `json:"bytes"`
	Share    float64 `json:"share"` // of all tensor bytes, 0 to 1
}

// llamaFileTypes maps general.file_type to llama.cpp's names (enum
// llama_ftype in llama.h, without the LLAMA_FTYPE_ and MOSTLY_ prefixes).
// Ids 4 to 6 and 33 to 35 were retired.
var llamaFileTypes = map[uint64]string{
	0: "ALL_F32", 1: "MOSTLY_F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16",
	7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M",
	13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
	18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
	23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
	28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
	36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}

// llamaFtypeGuessed is the bit llama.cpp sets when it guessed the file type.
const llamaFtypeGuessed = 1024

func llamaFileTypeName(id uint64) string {
	guessed := ""
	if id&llamaFtypeGuessed != 0 {
		id &^= llamaFtypeGuessed
		guessed = " (guessed)"
	}
	if n, ok := llamaFileTypes[id]; ok {
		return n + guessed
	}
	return fmt.Sprintf("unknown (%d)", id)
}

// inspSpecialTokens are the special token ids inspect shows, in order, with
// llama.cpp's keys for them (its spelling: "seperator").
var inspSpecialTokens = []struct{ name, key string }{
	{"bos", "tokenizer.ggml.bos_token_id"},
	{"eos", "tokenizer.ggml.eos_token_id"},
	{"eot", "tokenizer.ggml.eot_token_id"},
	{"eom", "tokenizer.ggml.eom_token_id"},
	{"pad", "tokenizer.ggml.padding_token_id"},
	{"unk", "tokenizer.ggml.unknown_token_id"},
	{"sep", "tokenizer.ggml.seperator_token_id"},
	{"cls", "tokenizer.ggml.cls_token_id"},
	{"mask", "tokenizer.ggml.mask_token_id"},
}

// inspMaxArray is the longest array shown element by element; longer ones
// (vocabularies, scores, merges) are shown as their type and length.
const inspMaxArray = 16

func inspectModel(f *gguf.File) *inspectReport {
	r := &inspectReport{
		Path:            f.Path,
		GGUFVersion:     f.Version(),
		SizeBytes:       f.Size(),
		Parts:           len(f.Parts),
		Alignment:       f.Alignment(),
		Hyperparameters: map[string]any{},
		Metadata:        []inspectKV{},
		TensorCount:     len(f.Tensors),
		Tensors:         []inspectTensor{},
		Types:           []inspectTypeTotal{},
	}
	for _, p := range f.Parts {
		r.PartPaths = append(r.PartPaths, p.Path)
	}
	shown := map[string]bool{}
	str := func(key string) string {
		s, err := f.String(key)
		if err == nil {
			shown[key] = true
		}
		return s
	}
	r.Architecture = str("general.architecture")
	r.Name = str("general.name")
	shown["general.alignment"] = true
	if id, err := f.Uint("general.file_type"); err == nil {
		r.FileType = &inspectFileType{ID: id, Name: llamaFileTypeName(id)}
		shown["general.file_type"] = true
	}

	// Every "<arch>." key is a hyperparameter of the architecture.
	if r.Architecture != "" {
		prefix := r.Architecture + "."
		for _, kv := range f.KVs {
			if name, ok := strings.CutPrefix(kv.Key, prefix); ok {
				r.Hyperparameters[name] = inspJSONValue(kv.Value)
				r.hyper = append(r.hyper, kv)
				shown[kv.Key] = true
			}
		}
	}

	r.Tokenizer = inspectTokenizerOf(f, shown)
	if s, err := f.String("tokenizer.chat_template"); err == nil {
		r.ChatTemplate = inspectChatTemplate{Present: true, Bytes: len(s), text: s}
		shown["tokenizer.chat_template"] = true
	}

	for _, kv := range f.KVs {
		if !shown[kv.Key] {
			r.Metadata = append(r.Metadata, inspectKV{Key: kv.Key, Type: inspTypeName(kv.Value), Value: inspJSONValue(kv.Value), raw: kv.Value})
		}
	}

	byType := map[gguf.Type]*inspectTypeTotal{}
	for _, t := range f.Tensors {
		r.ParameterCount += t.Elements()
		r.TensorBytes += t.Size
		r.Tensors = append(r.Tensors, inspectTensor{Name: t.Name, Type: t.Type.String(), Shape: t.Dims, Bytes: t.Size, Part: t.Part + 1})
		tt := byType[t.Type]
		if tt == nil {
			tt = &inspectTypeTotal{Type: t.Type.String()}
			byType[t.Type] = tt
		}
		tt.Count++
		tt.Elements += t.Elements()
		tt.Bytes += t.Size
	}
	for _, tt := range byType {
		if r.TensorBytes > 0 {
			tt.Share = float64(tt.Bytes) / float64(r.TensorBytes)
		}
		r.Types = append(r.Types, *tt)
	}
	// Largest share first; the type name breaks ties so output is stable.
	sort.Slice(r.Types, func(i, j int) bool {
		if r.Types[i].Bytes != r.Types[j].Bytes {
			return r.Types[i].Bytes > r.Types[j].Bytes
		}
		return r.Types[i].Type < r.Types[j].Type
	})
	r.Parameters = inspParams(r.ParameterCount)
	return r
}

// inspectTokenizerOf gathers the tokenizer summary, marking the keys it
// uses as shown. It returns nil when the file has no tokenizer.
func inspectTokenizerOf(f *gguf.File, shown map[string]bool) *inspectTokenizer {
	has := false
	for _, kv := range f.KVs {
		if strings.HasPrefix(kv.Key, "tokenizer.ggml.") {
			has = true
			break
		}
	}
	if !has {
		return nil
	}
	tk := &inspectTokenizer{SpecialTokens: map[string]inspectToken{}}
	for key, dst := range map[string]*string{"tokenizer.ggml.model": &tk.Model, "tokenizer.ggml.pre": &tk.Pre} {
		if s, err := f.String(key); err == nil {
			*dst = s
			shown[key] = true
		}
	}
	tokens, err := f.Strings("tokenizer.ggml.tokens")
	if err == nil {
		shown["tokenizer.ggml.tokens"] = true
	}
	tk.VocabSize = len(tokens)
	if v, ok := f.Get("tokenizer.ggml.merges"); ok && v.Type == gguf.ValArray {
		tk.MergesCount = v.Len()
		shown["tokenizer.ggml.merges"] = true
	}
	for _, st := range inspSpecialTokens {
		id, err := f.Int(st.key)
		if err != nil {
			continue // absent, or not an integer: left in "other metadata"
		}
		shown[st.key] = true
		t := inspectToken{ID: id}
		if id >= 0 && id < int64(len(tokens)) {
			t.Text, t.Valid = tokens[id], true
		}
		tk.SpecialTokens[st.name] = t
	}
	for key, dst := range map[string]**bool{"tokenizer.ggml.add_bos_token": &tk.AddBOS, "tokenizer.ggml.add_eos_token": &tk.AddEOS} {
		if b, err := f.Bool(key); err == nil {
			*dst = &b
			shown[key] = true
		}
	}
	return tk
}

// inspTypeName is a value's type as inspect prints it: uint32, array[string].
func inspTypeName(v gguf.Value) string {
	if v.Type == gguf.ValArray {
		return "array[" + v.Elem.String() + "]"
	}
	return v.Type.String()
}

// inspJSONValue converts a metadata value to something encoding/json can write
// faithfully: float32s keep their shortest decimal form, NaN and infinities
// (which JSON lacks) become strings, and arrays longer than inspMaxArray
// become {"length": n}.
func inspJSONValue(v gguf.Value) any {
	switch x := v.Data().(type) {
	case float32:
		return inspJSONFloat(float64(x), 32)
	case float64:
		return inspJSONFloat(x, 64)
	case []gguf.Value:
		if len(x) > inspMaxArray {
			return map[string]int{"length": len(x)}
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inspJSONValue(e)
		}
		return out
	}
	if v.Type != gguf.ValArray {
		return v.Data()
	}
	if v.Len() > inspMaxArray {
		return map[string]int{"length": v.Len()}
	}
	switch x := v.Data().(type) {
	case []float32:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inspJSONFloat(float64(e), 32)
		}
		return out
	case []float64:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inspJSONFloat(e, 64)
		}
		return out
	case []uint8:
		// encoding/json would write []byte as base64; list the numbers.
		out := make([]int, len(x))
		for i, e := range x {
			out[i] = int(e)
		}
		return out
	}
	return v.Data()
}

func inspJSONFloat(x float64, bits int) any {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return strconv.FormatFloat(x, 'g', -1, bits)
	}
	return json.Number(strconv.FormatFloat(x, 'g', -1, bits))
}

// inspTextValue formats a value for the text report, on one line.
func inspTextValue(v gguf.Value) string {
	const maxString = 60
	switch x := v.Data().(type) {
	case string:
		if len(x) > maxString {
			return strconv.Quote(x[:maxString]) + fmt.Sprintf("… (%d bytes)", len(x))
		}
		return strconv.Quote(x)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	if v.Type != gguf.ValArray {
		return fmt.Sprint(v.Data())
	}
	if v.Len() > inspMaxArray {
		return fmt.Sprintf("[%s × %d]", v.Elem, v.Len())
	}
	b, err := json.Marshal(inspJSONValue(v))
	if err != nil {
		return v.String()
	}
	return string(b)
}

// inspParams writes a parameter count the way model cards do: 751.6M, 14.8B.
func inspParams(n uint64) string {
	switch {
	case n >= 1e12:
		return fmt.Sprintf("%.1fT", float64(n)/1e12)
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return strconv.FormatUint(n, 10)
}

// inspBytes writes a size in binary units: 1.4 MiB.
func inspBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func (r *inspectReport) writeText(out io.Writer, tensors bool) error {
	// The report is built in one tabwriter so each section's columns line
	// up; blank-line separated sections keep their own widths because
	// tabwriter aligns only consecutive lines.
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("path:\t%s\n", r.Path)
	p("gguf version:\t%d\n", r.GGUFVersion)
	p("size:\t%s (%d bytes)\n", inspBytes(uint64(r.SizeBytes)), r.SizeBytes)
	p("parts:\t%d\n", r.Parts)
	p("alignment:\t%d\n", r.Alignment)
	p("architecture:\t%s\n", inspOrNone(r.Architecture))
	p("name:\t%s\n", inspOrNone(r.Name))
	p("parameters:\t%s (%d)\n", r.Parameters, r.ParameterCount)
	if r.FileType != nil {
		p("file type:\t%s (%d)\n", r.FileType.Name, r.FileType.ID)
	} else {
		p("file type:\t(none)\n")
	}

	if len(r.hyper) > 0 {
		p("\nhyperparameters:\n")
		for _, kv := range r.hyper {
			p("  %s\t%s\n", inspCell(kv.Key), inspTextValue(kv.Value))
		}
	}

	if tk := r.Tokenizer; tk != nil {
		p("\ntokenizer:\n")
		p("  model\t%s\n", inspOrNone(tk.Model))
		p("  pre\t%s\n", inspOrNone(tk.Pre))
		p("  vocab size\t%d\n", tk.VocabSize)
		p("  merges\t%d\n", tk.MergesCount)
		for _, st := range inspSpecialTokens {
			t, ok := tk.SpecialTokens[st.name]
			if !ok {
				continue
			}
			text := strconv.Quote(t.Text)
			if !t.Valid {
				text = "(not in the vocabulary)"
			}
			p("  %s\t%d %s\n", st.name, t.ID, text)
		}
		if tk.AddBOS != nil {
			p("  add bos\t%v\n", *tk.AddBOS)
		}
		if tk.AddEOS != nil {
			p("  add eos\t%v\n", *tk.AddEOS)
		}
	}
	if r.ChatTemplate.Present {
		p("\nchat template:\tpresent (%d bytes)\n", r.ChatTemplate.Bytes)
	} else {
		p("\nchat template:\tnone\n")
	}

	if len(r.Metadata) > 0 {
		p("\nother metadata:\n")
		for _, kv := range r.Metadata {
			p("  %s\t%s\t%s\n", inspCell(kv.Key), kv.Type, inspTextValue(kv.raw))
		}
	}

	if tensors && len(r.Tensors) > 0 {
		p("\ntensors (%d):\n", len(r.Tensors))
		split := r.Parts > 1
		if split {
			p("  NAME\tTYPE\tSHAPE\tBYTES\tPART\n")
		} else {
			p("  NAME\tTYPE\tSHAPE\tBYTES\n")
		}
		for _, t := range r.Tensors {
			p("  %s\t%s\t%s\t%d", inspCell(t.Name), t.Type, inspShape(t.Shape), t.Bytes)
			if split {
				p("\t%d", t.Part)
			}
			p("\n")
		}
	}
	if len(r.Types) > 0 {
		p("\ntotals by type:\n")
		p("  TYPE\tTENSORS\tELEMENTS\tBYTES\tSHARE\n")
		for _, t := range r.Types {
			p("  %s\t%d\t%d\t%s\t%.1f%%\n", t.Type, t.Count, t.Elements, inspBytes(t.Bytes), 100*t.Share)
		}
		p("  total\t%d\t%d\t%s\t100.0%%\n", r.TensorCount, r.ParameterCount, inspBytes(r.TensorBytes))
	} else {
		p("\ntensors:\tnone\n")
	}
	return tw.Flush()
}

func inspShape(dims []uint64) string {
	s := make([]string, len(dims))
	for i, d := range dims {
		s[i] = strconv.FormatUint(d, 10)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// inspCell makes a name from the file safe for a table: a name with tabs,
// newlines or other unprintable bytes is quoted, so it cannot break the
// columns or the terminal.
func inspCell(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}

func inspOrNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
