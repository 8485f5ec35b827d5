package hub

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// HubHost is how model names spell the Hugging Face hub, as ollama and
// llama.cpp do: hf.co/ORG/REPO:QUANT.
const HubHost = "hf.co"

// DefaultQuant is the quantization pulled when a hub reference names none
// and the repository holds several (ollama's choice too).
const DefaultQuant = "Q4_K_M"

// Ref is what `ats pull` was asked for: a hub repository (with the
// quantization to pick from it) or the URL of a GGUF file.
type Ref struct {
	Repo  string // ORG/REPO on the hub; "" for a URL
	Quant string // as the user wrote it; "" when not given
	URL   string // a plain GGUF URL; "" for a hub repository
}

func (r Ref) String() string {
	if r.URL != "" {
		return r.URL
	}
	s := HubHost + "/" + r.Repo
	if r.Quant != "" {
		s += ":" + r.Quant
	}
	return s
}

// ParseRef reads hf.co/ORG/REPO[:QUANT] (or ORG/REPO[:QUANT], as
// llama.cpp's -hf takes it; also huggingface.co/..., or a hub
// repository's web address) or the http(s) URL of a .gguf file. A web page
// address of a file (.../blob/main/F.gguf) is taken as its download address
// (.../resolve/main/F.gguf), the mistake everyone makes once.
func ParseRef(s string) (Ref, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Ref{}, fmt.Errorf("empty model reference: want hf.co/ORG/REPO:QUANT or the URL of a .gguf file")
	}
	rest := s
	if strings.HasPrefix(rest, "http://") || strings.HasPrefix(rest, "https://") {
		u, err := url.Parse(rest)
		if err != nil {
			return Ref{}, fmt.Errorf("%q: %w", s, err)
		}
		if strings.HasSuffix(strings.ToLower(u.Path), ".gguf") {
			if isHubHost(u.Host) {
				u.Path = strings.Replace(u.Path, "/blob/", "/resolve/", 1)
			}
			return Ref{URL: u.String()}, nil
		}
		if !isHubHost(u.Host) {
			return Ref{}, fmt.Errorf("%q: a URL must name a .gguf file (or be a Hugging Face repository)", s)
		}
		rest = u.Host + strings.TrimSuffix(u.Path, "/")
	}
	host, repoQuant, ok := strings.Cut(rest, "/")
	if ok && !isHubHost(host) && strings.Count(rest, "/") == 1 && validSegment(host) && !strings.HasSuffix(strings.ToLower(rest), ".gguf") {
		// ORG/REPO[:QUANT] without the host, as llama.cpp's -hf takes it.
		host, repoQuant = HubHost, rest
	}
	if !ok || !isHubHost(host) {
		return Ref{}, fmt.Errorf("%q: want hf.co/ORG/REPO:QUANT (e.g. hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M) or the URL of a .gguf file", s)
	}
	repo, quant, _ := strings.Cut(repoQuant, ":")
	parts := strings.Split(repo, "/")
	if len(parts) != 2 || !validSegment(parts[0]) || !validSegment(parts[1]) {
		return Ref{}, fmt.Errorf("%q: the repository must be ORG/REPO, each of letters, digits, '.', '_' and '-'", s)
	}
	if quant != "" && !validSegment(quant) {
		return Ref{}, fmt.Errorf("%q: quantization %q: want letters, digits, '.', '_' and '-' (e.g. Q4_K_M)", s, quant)
	}
	return Ref{Repo: repo, Quant: quant}, nil
}

func isHubHost(h string) bool {
	h = strings.ToLower(h)
	return h == "hf.co" || h == "huggingface.co" || h == "www.huggingface.co"
}

// validSegment reports whether s can be one path segment of a name:
// letters, digits, '.', '_', '-', and not "." or "..".
func validSegment(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 200 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

var splitSuffix = regexp.MustCompile(`(?i)^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// ggufModel is one model in a repository: a single file or the parts of a
// split one, in order.
type ggufModel struct {
	files []string // repository paths
}

// key is the name of the model without the split suffix, to group parts.
func (g ggufModel) first() string { return g.files[0] }

// groupGGUF gathers a repository's .gguf files into models, parts of a
// split model together (complete sets only). Multimodal projectors
// (mmproj) are not language models and are left out.
func groupGGUF(files []string) (models []ggufModel, incomplete []string) {
	split := map[string][]string{} // prefix and count -> parts
	counts := map[string]int{}
	for _, f := range files {
		base := strings.ToLower(path.Base(f))
		if !strings.HasSuffix(base, ".gguf") || strings.Contains(base, "mmproj") {
			continue
		}
		if m := splitSuffix.FindStringSubmatch(f); m != nil {
			n, _ := strconv.Atoi(m[3])
			key := m[1] + "\x00" + m[3]
			split[key] = append(split[key], f)
			counts[key] = n
			continue
		}
		models = append(models, ggufModel{files: []string{f}})
	}
	for key, parts := range split {
		sort.Strings(parts)
		n := counts[key]
		ok := len(parts) == n
		for i, p := range parts {
			m := splitSuffix.FindStringSubmatch(p)
			if k, _ := strconv.Atoi(m[2]); k != i+1 {
				ok = false
			}
		}
		if !ok {
			incomplete = append(incomplete, parts[0])
			continue
		}
		models = append(models, ggufModel{files: parts})
	}
	sort.Slice(models, func(i, j int) bool { return models[i].first() < models[j].first() })
	return models, incomplete
}

// quantPattern finds llama.cpp quantization names in file names: Q4_K_M,
// IQ4_XS, Q8_0, F16, BF16, TQ1_0, MXFP4, Q4_0_4_4, ...
var quantPattern = regexp.MustCompile(`(?i)(?:^|[^a-z0-9])((?:I?Q\d+(?:_[A-Z0-9]+)*)|(?:TQ\d_\d)|(?:MXFP4(?:_MOE)?)|(?:B?F16)|(?:F32))(?:[^a-z0-9_]|$)`)

// quantOf is the quantization named in a repository path ("" if none).
func quantOf(p string) string {
	name := strings.TrimSuffix(path.Base(p), path.Ext(p))
	if m := splitSuffix.FindStringSubmatch(path.Base(p)); m != nil {
		name = m[1]
	}
	// The last match: names like "Qwen3-8B-Q4_K_M" put the quantization
	// at the end, and "Q8" in a model name must not win over it.
	all := quantPattern.FindAllStringSubmatch(name, -1)
	if len(all) == 0 {
		// Large models keep their parts in a folder named after the quant.
		if dir := path.Base(path.Dir(p)); dir != "." && dir != "/" {
			if m := quantPattern.FindStringSubmatch(dir); m != nil {
				return strings.ToUpper(m[1])
			}
		}
		return ""
	}
	return strings.ToUpper(all[len(all)-1][1])
}

// pickGGUF chooses the model of quantization quant (case-insensitive)
// among a repository's files. With quant "", a repository of one model
// gives that model and one of several gives DefaultQuant. It returns the
// files in order and the quantization as the file names spell it.
func pickGGUF(repo string, files []string, quant string) ([]string, string, error) {
	models, incomplete := groupGGUF(files)
	if len(models) == 0 {
		if len(incomplete) > 0 {
			return nil, "", fmt.Errorf("%s: the split model %s misses parts", repo, incomplete[0])
		}
		return nil, "", fmt.Errorf("%s has no .gguf file", repo)
	}
	if quant == "" && len(models) == 1 {
		return models[0].files, quantOf(models[0].first()), nil
	}
	want := quant
	if want == "" {
		want = DefaultQuant
	}
	var hits []ggufModel
	for _, m := range models {
		if strings.EqualFold(quantOf(m.first()), want) {
			hits = append(hits, m)
		}
	}
	switch {
	case len(hits) == 1:
		return hits[0].files, quantOf(hits[0].first()), nil
	case len(hits) > 1:
		var names []string
		for _, h := range hits {
			names = append(names, h.first())
		}
		return nil, "", fmt.Errorf("%s: %d files are %s: %s; pull one by its URL (https://huggingface.co/%s/resolve/main/FILE)",
			repo, len(hits), want, strings.Join(names, ", "), repo)
	}
	var quants []string
	for _, m := range models {
		if q := quantOf(m.first()); q != "" && !slices.Contains(quants, q) {
			quants = append(quants, q)
		}
	}
	sort.Strings(quants)
	what := "no quantization was given and " + DefaultQuant + " is not there"
	if quant != "" {
		what = "no " + quant + " file"
	}
	if len(quants) == 0 {
		return nil, "", fmt.Errorf("%s: %s; its GGUF files name no quantization, pull one by its URL", repo, what)
	}
	return nil, "", fmt.Errorf("%s: %s; it has %s (e.g. ats pull %s/%s:%s)", repo, what, strings.Join(quants, ", "), HubHost, repo, quants[0])
}
