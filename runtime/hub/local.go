package hub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Models that are not downloads: a local GGUF file registered by name
// (ats pull ./file.gguf), and downloads that never finished.

// ImportOptions say how to register a local file.
type ImportOptions struct {
	Name    string   // default: the file's name, lower case, without .gguf
	Aliases []string // more names
	Quant   string   // the file's quantization (the caller reads it from the file)
}

// Import registers the local GGUF file path (and the other parts of a
// split model) under a name, without copying it: the model's folder gets
// a hard link to each file, or a symbolic link where a hard link cannot be
// made (another file system). Removing the model removes the links only.
func (s *Store) Import(path string, opt ImportOptions) (*Manifest, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(abs)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return nil, fmt.Errorf("%s is a folder, not a GGUF file", path)
	}
	base := filepath.Base(abs)
	parts := []string{abs}
	if m := splitSuffix.FindStringSubmatch(base); m != nil {
		if m[2] != "00001" {
			return nil, fmt.Errorf("%s is part %s of a split model: give the first part (-00001-of-%s.gguf)", path, m[2], m[3])
		}
		parts = parts[:0]
		n := 0
		fmt.Sscanf(m[3], "%d", &n)
		for i := 1; i <= n; i++ {
			parts = append(parts, filepath.Join(filepath.Dir(abs), fmt.Sprintf("%s-%05d-of-%s.gguf", m[1], i, m[3])))
		}
	}
	name := opt.Name
	if name == "" {
		stem := strings.TrimSuffix(base, filepath.Ext(base))
		if m := splitSuffix.FindStringSubmatch(base); m != nil {
			stem = m[1]
		}
		name = strings.ToLower(sanitizeName(stem))
	}
	m := &Manifest{Name: name, Aliases: opt.Aliases, Source: abs, Quant: opt.Quant, Pulled: time.Now().UTC()}
	for _, n := range m.Names() {
		if err := ValidateName(n); err != nil {
			return nil, err
		}
	}
	dir, err := s.dirFor(name)
	if err != nil {
		return nil, err
	}
	m.dir = dir
	if err := s.checkNames(m); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, ManifestName)); err == nil {
		return nil, fmt.Errorf("a model called %s is already in %s: ats rm %s first, or choose another --name", name, s.Dir, name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := s.lockModel(context.Background(), dir, name, false, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, p := range parts {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("part of %s: %w", path, err)
		}
		link := filepath.Join(dir, filepath.Base(p))
		os.Remove(link)
		if err := os.Link(p, link); err != nil {
			if err := os.Symlink(p, link); err != nil {
				return nil, fmt.Errorf("linking %s into %s: %w", p, dir, err)
			}
		}
		m.Files = append(m.Files, File{Name: filepath.Base(p), Size: st.Size(), URL: "file://" + filepath.ToSlash(p)})
	}
	if err := writeManifest(m); err != nil {
		return nil, err
	}
	return m, nil
}
