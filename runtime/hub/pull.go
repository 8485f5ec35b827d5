package hub

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// PullOptions tune a pull.
type PullOptions struct {
	// Name is the model's name; "" gives hf.co/ORG/REPO:QUANT for the hub
	// and the file's name without .gguf for a URL.
	Name string
	// Aliases are more names for it (e.g. qwen3:8b).
	Aliases []string
	// SHA256 is the expected digest of a URL's file, where its source
	// publishes one elsewhere.
	SHA256 string
	// Progress hears each file's transfer; nil: nothing.
	Progress Progress
}

// PullResult is a pulled model.
type PullResult struct {
	Manifest *Manifest
	// Fetched is the files downloaded now; the rest were there already.
	Fetched []File
}

// Pull downloads the model ref names into the store, or finds it there
// complete. Files are downloaded next to their final place as .partial
// files (a later pull resumes them), verified, renamed into place, and the
// manifest is written last, so a model is found only when it is whole.
func (s *Store) Pull(ctx context.Context, c *Client, ref Ref, opt PullOptions) (*PullResult, error) {
	if opt.Progress == nil {
		opt.Progress = noProgress{}
	}
	var (
		m     *Manifest
		specs []fetchSpec
		err   error
	)
	if ref.URL != "" {
		m, specs, err = s.planURL(ref, opt)
	} else {
		m, specs, err = s.planHub(ctx, c, ref, opt)
	}
	if err != nil {
		return nil, err
	}
	if err := s.checkNames(m); err != nil {
		return nil, err
	}
	// The model's folder is made with the first file's data (fetch): a
	// pull that fails before leaves nothing in the models directory.
	unlock, err := s.lockModel(ctx, m.dir, m.Name, true, opt.Progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	old, _ := readManifest(filepath.Join(m.dir, ManifestName))
	if old != nil && !strings.EqualFold(old.Name, m.Name) {
		return nil, fmt.Errorf("%s holds %s already; pull with another --name or ats rm %s", m.dir, old.Name, old.Name)
	}
	res := &PullResult{Manifest: m}
	recorded := false
	record := func() error { // once: this folder holds an unfinished pull of m
		if recorded {
			return nil
		}
		recorded = true
		return writePending(m)
	}
	for _, sp := range specs {
		if f, ok := present(old, sp); ok {
			m.Files = append(m.Files, f)
			continue
		}
		sp.created = record
		f, err := c.fetch(ctx, sp, opt.Progress)
		if err != nil {
			s.tidyUnfinished(m.dir)
			return nil, err
		}
		m.Files = append(m.Files, f)
		res.Fetched = append(res.Fetched, f)
	}
	if old != nil {
		m.Aliases = mergeNames(old.Aliases, m.Aliases, m.Name)
		if len(res.Fetched) == 0 {
			m.Pulled = old.Pulled
		}
	}
	if err := writeManifest(m); err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(m.dir, PendingName))
	// Files of an earlier version of the model that this one dropped.
	if old != nil {
		for _, f := range old.Files {
			if !containsFile(m.Files, f.Name) {
				os.Remove(filepath.Join(m.dir, f.Name))
			}
		}
	}
	return res, nil
}

// present reports whether the file sp describes is in place already, as
// the earlier pull recorded it (same size and, where known, digest).
func present(old *Manifest, sp fetchSpec) (File, bool) {
	if old == nil {
		return File{}, false
	}
	name := filepath.Base(sp.dest)
	for _, f := range old.Files {
		if f.Name != name || sp.size >= 0 && f.Size != sp.size || sp.sha256 != "" && f.SHA256 != sp.sha256 {
			continue
		}
		if st, err := os.Stat(sp.dest); err == nil && st.Size() == f.Size {
			return f, true
		}
	}
	return File{}, false
}

func containsFile(fs []File, name string) bool {
	for _, f := range fs {
		if f.Name == name {
			return true
		}
	}
	return false
}

// mergeNames is a and b without duplicates (case-insensitive) and without
// the name itself.
func mergeNames(a, b []string, name string) []string {
	var out []string
	seen := map[string]bool{strings.ToLower(name): true}
	for _, n := range append(append([]string{}, a...), b...) {
		if k := strings.ToLower(n); !seen[k] {
			seen[k] = true
			out = append(out, n)
		}
	}
	return out
}

// checkNames refuses a name or alias that already means another model.
func (s *Store) checkNames(m *Manifest) error {
	ms, _ := s.List()
	for _, n := range m.Names() {
		if err := ValidateName(n); err != nil {
			return err
		}
		if other := conflict(ms, m, n); other != nil {
			return fmt.Errorf("the name %q is taken by %s (in %s): choose another, or ats rm it first", n, other.Name, other.dir)
		}
	}
	return nil
}

// planHub lists the repository, picks the files of the quantization and
// names the model.
func (s *Store) planHub(ctx context.Context, c *Client, ref Ref, opt PullOptions) (*Manifest, []fetchSpec, error) {
	info, err := c.Repo(ctx, ref.Repo)
	if err != nil {
		return nil, nil, err
	}
	byPath := map[string]RepoFile{}
	var paths []string
	for _, f := range info.Files {
		byPath[f.Path] = f
		paths = append(paths, f.Path)
	}
	files, quant, err := pickGGUF(info.ID, paths, ref.Quant)
	if err != nil {
		return nil, nil, err
	}
	rev := info.SHA
	if rev == "" {
		rev = "main"
	}
	name := opt.Name
	if name == "" {
		name = HubHost + "/" + info.ID
		if quant != "" {
			name += ":" + quant
		}
	}
	m := &Manifest{Name: name, Source: (Ref{Repo: info.ID, Quant: quant}).String(), Repo: info.ID, Revision: info.SHA,
		Quant: quant, Pulled: time.Now().UTC()}
	m.Aliases = mergeNames(nil, opt.Aliases, name)
	if a := shortAlias(info.ID, quant); a != "" && opt.Name == "" {
		ms, _ := s.List()
		if ValidateName(a) == nil && conflict(ms, nil, a) == nil || isOwnAlias(ms, name, a) {
			m.Aliases = mergeNames(m.Aliases, []string{a}, name)
		}
	}
	if m.dir, err = s.dirFor(name); err != nil {
		return nil, nil, err
	}
	var specs []fetchSpec
	seen := map[string]string{}
	for _, p := range files {
		base := path.Base(p)
		if prev, ok := seen[base]; ok {
			return nil, nil, fmt.Errorf("%s: %s and %s have the same file name", info.ID, prev, p)
		}
		seen[base] = p
		f := byPath[p]
		specs = append(specs, fetchSpec{url: c.ResolveURL(info.ID, rev, p), dest: filepath.Join(m.dir, base), size: f.Size, sha256: f.SHA256})
	}
	return m, specs, nil
}

// isOwnAlias reports whether alias already belongs to the model called
// name (a second pull of it).
func isOwnAlias(ms []*Manifest, name, alias string) bool {
	for _, m := range ms {
		if strings.EqualFold(m.Name, name) {
			for _, a := range m.Aliases {
				if strings.EqualFold(a, alias) {
					return true
				}
			}
		}
	}
	return false
}

// shortAlias is the short name a hub model also answers to: the
// repository's name in lower case without "-GGUF", and the quantization as
// the tag: qwen3-8b:q4_k_m for hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M.
func shortAlias(repo, quant string) string {
	_, name, _ := strings.Cut(repo, "/")
	name = strings.ToLower(name)
	for _, suf := range []string{"-gguf", "_gguf", ".gguf"} {
		name = strings.TrimSuffix(name, suf)
	}
	if name == "" {
		return ""
	}
	if quant != "" {
		name += ":" + strings.ToLower(quant)
	}
	return name
}

// planURL names a URL's model and finds its parts: a URL of the first part
// of a split model (NAME-00001-of-0000N.gguf) brings the others.
func (s *Store) planURL(ref Ref, opt PullOptions) (*Manifest, []fetchSpec, error) {
	u, err := url.Parse(ref.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", ref.URL, err)
	}
	base := path.Base(u.Path)
	if b, err := url.PathUnescape(base); err == nil {
		base = b
	}
	if base != filepath.Base(base) || base == "." || base == ".." || base == "" {
		return nil, nil, fmt.Errorf("%s: the file name %q cannot be used", ref.URL, base)
	}
	stem := strings.TrimSuffix(base, path.Ext(base))
	bases := []string{base}
	if sm := splitSuffix.FindStringSubmatch(base); sm != nil {
		if sm[2] != "00001" {
			return nil, nil, fmt.Errorf("%s is part %s of a split model: pull the first part (-00001-of-%s.gguf), which brings the others", ref.URL, strings.TrimLeft(sm[2], "0"), sm[3])
		}
		var n int
		fmt.Sscanf(sm[3], "%d", &n)
		if n < 1 || n > 999 {
			return nil, nil, fmt.Errorf("%s: %d parts", ref.URL, n)
		}
		stem = sm[1]
		bases = nil
		for i := 1; i <= n; i++ {
			bases = append(bases, fmt.Sprintf("%s-%05d-of-%s.gguf", sm[1], i, sm[3]))
		}
		if opt.SHA256 != "" {
			return nil, nil, errors.New("--sha256 checks a single file; this model has several parts")
		}
	}
	if opt.SHA256 != "" && !sha256Hex.MatchString(strings.ToLower(opt.SHA256)) {
		return nil, nil, fmt.Errorf("--sha256 %q: want 64 hexadecimal digits", opt.SHA256)
	}
	name := opt.Name
	if name == "" {
		name = sanitizeName(stem)
	}
	m := &Manifest{Name: name, Source: ref.URL, Pulled: time.Now().UTC()}
	m.Aliases = mergeNames(nil, opt.Aliases, name)
	if m.dir, err = s.dirFor(name); err != nil {
		return nil, nil, err
	}
	dirURL := *u
	dirURL.Path = path.Dir(u.Path)
	dirURL.RawPath = ""
	var specs []fetchSpec
	for _, b := range bases {
		pu := *u
		pu.Path = strings.TrimSuffix(dirURL.Path, "/") + "/" + b
		pu.RawPath = ""
		specs = append(specs, fetchSpec{url: pu.String(), dest: filepath.Join(m.dir, b), size: -1, sha256: strings.ToLower(opt.SHA256)})
	}
	return m, specs, nil
}

// sanitizeName makes a file name a model name: characters other than
// letters, digits, '.', '_' and '-' become '-'.
func sanitizeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	s = strings.Trim(string(b), ".")
	if s == "" {
		s = "model"
	}
	return s
}

// Partial lists the downloads in progress in the store (.partial files)
// with their sizes so far.
func (s *Store) Partial() (map[string]int64, error) {
	out := map[string]int64{}
	err := filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), partialSuffix) {
			if info, err := d.Info(); err == nil {
				out[p] = info.Size()
			}
		}
		return nil
	})
	return out, err
}
