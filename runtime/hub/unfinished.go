package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// An interrupted pull leaves its .partial files for the next pull of the
// same model to resume, and a record of what it was pulling (PendingName)
// beside them, so that `ats list` can name it and `ats rm NAME` delete
// it. A pull that fails before any data arrives (a 404, say) leaves
// nothing: its folder is made with the first byte, and a failed pull
// removes its empty partial files and the folders they leave empty.

// PendingName is the record of an unfinished pull in its model's folder.
const PendingName = "pull.json"

// Unfinished is a pull that did not finish: its .partial files wait for
// the next pull of the same model.
type Unfinished struct {
	// Name is the model's name (or, for partial files without a record,
	// their folder's path in the models directory).
	Name    string    `json:"name"`
	Source  string    `json:"source,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Files   []string  `json:"files"` // the partial files, by their final names
	Bytes   int64     `json:"bytes"` // downloaded so far

	dir string
}

// Dir is the model's folder.
func (u *Unfinished) Dir() string { return u.dir }

type pending struct {
	Name    string    `json:"name"`
	Source  string    `json:"source"`
	Started time.Time `json:"started"`
}

func writePending(m *Manifest) error {
	b, err := json.MarshalIndent(pending{Name: m.Name, Source: m.Source, Started: time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(m.dir, PendingName), append(b, '\n'))
}

// Unfinished lists the unfinished pulls in the store, by name.
func (s *Store) Unfinished() ([]*Unfinished, error) {
	byDir := map[string]*Unfinished{}
	err := filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), partialSuffix) {
			return nil
		}
		dir := filepath.Dir(p)
		u := byDir[dir]
		if u == nil {
			u = &Unfinished{dir: dir}
			if b, err := os.ReadFile(filepath.Join(dir, PendingName)); err == nil {
				var rec pending
				if json.Unmarshal(b, &rec) == nil {
					u.Name, u.Source, u.Started = rec.Name, rec.Source, rec.Started
				}
			}
			if u.Name == "" { // left by an older ats, or the record is lost
				u.Name = s.nameOf(dir)
			}
			byDir[dir] = u
		}
		u.Files = append(u.Files, strings.TrimSuffix(d.Name(), partialSuffix))
		if info, err := d.Info(); err == nil {
			u.Bytes += info.Size()
		}
		return nil
	})
	var out []*Unfinished
	for _, u := range byDir {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return strings.ToLower(out[i].Name) < strings.ToLower(out[j].Name) })
	return out, err
}

// RemoveUnfinished deletes the unfinished pull of a model: its partial
// files and its record, then the folders left empty. name is the model's
// name as the pull gave it (or the folder's path, as Unfinished lists
// it).
func (s *Store) RemoveUnfinished(name string) (*Unfinished, error) {
	all, err := s.Unfinished()
	if err != nil {
		return nil, err
	}
	q := normalizeName(name)
	if ref, err := ParseRef(name); err == nil && ref.URL == "" {
		q = ref.String() // Org/Repo:QUANT as hf.co/Org/Repo:QUANT
	}
	var u *Unfinished
	for _, x := range all {
		rel, _ := filepath.Rel(s.Dir, x.dir)
		if strings.EqualFold(x.Name, q) || strings.EqualFold(filepath.ToSlash(rel), name) {
			u = x
			break
		}
	}
	if u == nil {
		return nil, &NotFoundError{Name: name, Dir: s.Dir}
	}
	unlock, err := s.lockModel(context.Background(), u.dir, u.Name, false, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, f := range u.Files {
		p := filepath.Join(u.dir, f+partialSuffix)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing %s: %w", p, err)
		}
	}
	os.Remove(filepath.Join(u.dir, PendingName))
	s.removeEmptyDirs(u.dir)
	return u, nil
}

// tidyUnfinished cleans up after a failed pull in dir: partial files that
// hold nothing are removed, the record with them when no partial file is
// left, and the folders left empty.
func (s *Store) tidyUnfinished(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	left := false
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), partialSuffix) {
			continue
		}
		if info, err := e.Info(); err == nil && info.Size() == 0 {
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		left = true
	}
	if !left {
		os.Remove(filepath.Join(dir, PendingName))
	}
	s.removeEmptyDirs(dir)
}

// removeEmptyDirs removes dir and its parents up to the models directory
// while they are empty.
func (s *Store) removeEmptyDirs(dir string) {
	root := filepath.Clean(s.Dir)
	for d := filepath.Clean(dir); len(d) > len(root) && strings.HasPrefix(d, root+string(filepath.Separator)); d = filepath.Dir(d) {
		if os.Remove(d) != nil { // not empty, or gone: stop
			return
		}
	}
}

// nameOf is the model name whose folder is dir (the inverse of dirFor:
// HOST/ORG/REPO/TAG is HOST/ORG/REPO:TAG), else the folder's path.
func (s *Store) nameOf(dir string) string {
	rel, err := filepath.Rel(s.Dir, dir)
	if err != nil {
		return dir
	}
	segs := strings.Split(filepath.ToSlash(rel), "/")
	if len(segs) < 4 { // not HOST/ORG/REPO/TAG: the folder's path
		return filepath.ToSlash(rel)
	}
	return strings.Join(segs[:len(segs)-1], "/") + ":" + segs[len(segs)-1]
}
