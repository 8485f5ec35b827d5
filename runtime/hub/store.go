// Package hub keeps GGUF models by name: a models directory, `ats pull`
// from the Hugging Face hub or a URL (resumable, verified, placed
// atomically), and the lookups behind `ats list`, `ats rm`, `ats show` and
// every -m NAME.
//
// Each model has a folder in the models directory holding its GGUF files
// under their own names (so the parts of a split model find each other)
// and a manifest, model.json, written last: a folder without a manifest is
// a pull in progress, and only models with one are listed or found.
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// ManifestName is the file in a model's folder that says what it holds.
const ManifestName = "model.json"

// DefaultDir is where models are kept: $ATS_MODELS, else the user's data
// directory: $XDG_DATA_HOME/ats/models or ~/.local/share/ats/models on
// Linux and other Unix systems, ~/Library/Application Support/ats/models on
// macOS, %LocalAppData%\ats\models on Windows.
func DefaultDir() (string, error) {
	if d := os.Getenv("ATS_MODELS"); d != "" {
		return d, nil
	}
	switch goruntime.GOOS {
	case "windows":
		// UserCacheDir is %LocalAppData% there: models are large and
		// belong to this machine, not to a roaming profile.
		d, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("models directory: %w (set ATS_MODELS)", err)
		}
		return filepath.Join(d, "ats", "models"), nil
	case "darwin", "ios":
		d, err := os.UserConfigDir() // ~/Library/Application Support
		if err != nil {
			return "", fmt.Errorf("models directory: %w (set ATS_MODELS)", err)
		}
		return filepath.Join(d, "ats", "models"), nil
	}
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "ats", "models"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("models directory: %w (set ATS_MODELS)", err)
	}
	return filepath.Join(home, ".local", "share", "ats", "models"), nil
}

// File is one GGUF file of a model.
type File struct {
	Name   string `json:"name"`   // in the model's folder
	Size   int64  `json:"size"`   // bytes
	SHA256 string `json:"sha256"` // hex digest of the file as downloaded
	// Verified: SHA256 matched the digest the source published (the
	// hub's LFS sha256); false where it published none.
	Verified bool   `json:"verified"`
	URL      string `json:"url"` // where it was downloaded from
}

// Manifest describes a pulled model. Its JSON is model.json.
type Manifest struct {
	Name     string    `json:"name"`              // hf.co/ORG/REPO:QUANT, or chosen with --name
	Aliases  []string  `json:"aliases,omitempty"` // other names that find it
	Source   string    `json:"source"`            // what was pulled: the reference or URL
	Repo     string    `json:"repo,omitempty"`    // ORG/REPO on the hub
	Revision string    `json:"revision,omitempty"`
	Quant    string    `json:"quant,omitempty"`
	Files    []File    `json:"files"` // the first is the one to open
	Pulled   time.Time `json:"pulled"`

	dir string
}

// Dir is the model's folder.
func (m *Manifest) Dir() string { return m.dir }

// Path is the file to open: the model, or the first part of a split one.
func (m *Manifest) Path() string { return filepath.Join(m.dir, m.Files[0].Name) }

// Size is the bytes of all its files.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Names are the model's name and aliases.
func (m *Manifest) Names() []string { return append([]string{m.Name}, m.Aliases...) }

// Store is a models directory.
type Store struct {
	Dir string
}

// OpenStore is the store at $ATS_MODELS or the default directory. The
// directory need not exist yet.
func OpenStore() (*Store, error) {
	d, err := DefaultDir()
	if err != nil {
		return nil, err
	}
	return &Store{Dir: d}, nil
}

// dirFor is the folder of the model named name: its segments as folders,
// the tag (after ':') as the last one.
func (s *Store) dirFor(name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	segs := strings.Split(strings.Replace(name, ":", "/", 1), "/")
	return filepath.Join(append([]string{s.Dir}, segs...)...), nil
}

// ValidateName checks a model name or alias: segments of letters, digits,
// '.', '_' and '-' separated by '/', with at most one ":TAG" at the end.
func ValidateName(name string) error {
	base, tag, hasTag := strings.Cut(name, ":")
	bad := base == "" || hasTag && !validSegment(tag)
	for _, seg := range strings.Split(base, "/") {
		bad = bad || !validSegment(seg)
	}
	if bad {
		return fmt.Errorf("model name %q: want segments of letters, digits, '.', '_' and '-' separated by '/', and an optional :TAG (e.g. qwen3:8b)", name)
	}
	return nil
}

// List returns the pulled models, by name. A manifest that cannot be read
// is reported in errs but does not hide the others.
func (s *Store) List() (ms []*Manifest, errs []error) {
	err := filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == s.Dir {
				return filepath.SkipDir
			}
			errs = append(errs, err)
			return nil
		}
		if d.IsDir() || d.Name() != ManifestName {
			return nil
		}
		m, err := readManifest(p)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		ms = append(ms, m)
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	sort.Slice(ms, func(i, j int) bool { return strings.ToLower(ms[i].Name) < strings.ToLower(ms[j].Name) })
	return ms, errs
}

func readManifest(p string) (*Manifest, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if m.Name == "" || len(m.Files) == 0 {
		return nil, fmt.Errorf("%s: no name or no files", p)
	}
	for _, f := range m.Files {
		if f.Name != filepath.Base(f.Name) || f.Name == "." || f.Name == ".." {
			return nil, fmt.Errorf("%s: file name %q is not a plain name", p, f.Name)
		}
	}
	m.dir = filepath.Dir(p)
	return &m, nil
}

// writeManifest writes m's model.json atomically.
func writeManifest(m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(m.dir, ManifestName), append(b, '\n'))
}

func writeFileAtomic(p string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p)+"-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}

// NotFoundError says that no pulled model has a name.
type NotFoundError struct {
	Name string
	Dir  string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no model named %q in %s", e.Name, e.Dir)
}

// normalizeName makes the spellings of a hub name alike: huggingface.co
// for hf.co, no https://.
func normalizeName(q string) string {
	q = strings.TrimPrefix(strings.TrimPrefix(q, "https://"), "http://")
	for _, h := range []string{"huggingface.co/", "www.huggingface.co/"} {
		if len(q) > len(h) && strings.EqualFold(q[:len(h)], h) {
			q = HubHost + "/" + q[len(h):]
		}
	}
	return q
}

// Find returns the model a name means: its name or an alias (case does not
// matter), or, for a name without a :TAG, the one model whose name or
// alias has that name before its tag (hf.co/ORG/REPO for the only quant
// pulled from it, qwen3 for qwen3:8b when no other qwen3 is there).
func (s *Store) Find(name string) (*Manifest, error) {
	q := normalizeName(name)
	ms, errs := s.List()
	for _, m := range ms {
		for _, n := range m.Names() {
			if strings.EqualFold(n, q) {
				return m, nil
			}
		}
	}
	if !strings.Contains(q, ":") {
		var hits []*Manifest
		for _, m := range ms {
			for _, n := range m.Names() {
				if base, _, _ := strings.Cut(n, ":"); strings.EqualFold(base, q) {
					hits = append(hits, m)
					break
				}
			}
		}
		if len(hits) == 1 {
			return hits[0], nil
		}
		if len(hits) > 1 {
			var names []string
			for _, m := range hits {
				names = append(names, m.Name)
			}
			return nil, fmt.Errorf("%q could be %s: say which", name, strings.Join(names, " or "))
		}
	}
	if len(errs) > 0 && !errors.Is(errs[0], fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (and %v)", &NotFoundError{Name: name, Dir: s.Dir}, errs[0])
	}
	return nil, &NotFoundError{Name: name, Dir: s.Dir}
}

// Remove deletes a model: its files, its manifest and downloads in
// progress in its folder, then the folders left empty up to the models
// directory. Other files, and other models' folders below it, stay.
func (s *Store) Remove(name string) (*Manifest, error) {
	m, err := s.Find(name)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lockModel(context.Background(), m.dir, m.Name, false, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, f := range m.Files {
		p := filepath.Join(m.dir, f.Name)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing %s: %w", p, err)
		}
	}
	// Downloads in progress in its folder: of these files, or of a newer
	// version of the model.
	if entries, err := os.ReadDir(m.dir); err == nil {
		for _, e := range entries {
			if !e.IsDir() && strings.HasSuffix(e.Name(), partialSuffix) {
				os.Remove(filepath.Join(m.dir, e.Name()))
			}
		}
	}
	os.Remove(filepath.Join(m.dir, PendingName))
	if err := os.Remove(filepath.Join(m.dir, ManifestName)); err != nil {
		return nil, fmt.Errorf("removing %s: %w", filepath.Join(m.dir, ManifestName), err)
	}
	s.removeEmptyDirs(m.dir)
	return m, nil
}

// conflict returns the model other than self that already answers to
// name, if any.
func conflict(ms []*Manifest, self *Manifest, name string) *Manifest {
	for _, m := range ms {
		if self != nil && m.dir == self.dir {
			continue
		}
		if slices.ContainsFunc(m.Names(), func(n string) bool { return strings.EqualFold(n, name) }) {
			return m
		}
	}
	return nil
}
