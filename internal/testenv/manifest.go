package testenv

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ManifestName is the file in testdata/ that lists what the tests read.
const ManifestName = "MANIFEST"

// How a file of the manifest is made from what testdata/ stores.
const (
	OpCopy    = "copy"    // stored as it is, under its own name
	OpGunzip  = "gunzip"  // gzip of the file: gunzip STORED
	OpBF16XOR = "bf16xor" // bf16xor BASE STORED: every 16-bit word of BASE rounded from f16 to bf16, XOR the gunzipped STORED
)

// Entry is one line of the manifest: a file the tests read (Path, relative
// to testdata/), the SHA-256 of its content, and how to make it.
type Entry struct {
	SHA256 string
	Path   string
	Op     string
	Args   []string // stored files the op reads, relative to testdata/
}

// String is the entry's manifest line.
func (e Entry) String() string {
	return strings.Join(append([]string{e.SHA256, e.Path, e.Op}, e.Args...), " ")
}

// stored lists the files of testdata/ that the entry reads.
func (e Entry) stored() []string {
	if e.Op == OpCopy {
		return []string{e.Path}
	}
	return e.Args
}

// ParseManifest reads a manifest: one entry a line, # starts a comment.
func ParseManifest(b []byte) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s line %d: want SHA256 PATH OP [ARGS], got %q", ManifestName, n, line)
		}
		e := Entry{SHA256: f[0], Path: f[1], Op: f[2], Args: f[3:]}
		want := map[string]int{OpCopy: 0, OpGunzip: 1, OpBF16XOR: 2}
		args, known := want[e.Op]
		switch {
		case len(e.SHA256) != 64:
			return nil, fmt.Errorf("%s line %d: %q is not a SHA-256 in hex", ManifestName, n, e.SHA256)
		case !known:
			return nil, fmt.Errorf("%s line %d: unknown op %q (want copy, gunzip or bf16xor)", ManifestName, n, e.Op)
		case len(e.Args) != args:
			return nil, fmt.Errorf("%s line %d: %s takes %d arguments, got %d", ManifestName, n, e.Op, args, len(e.Args))
		}
		for _, p := range append([]string{e.Path}, e.Args...) {
			if !filepath.IsLocal(filepath.FromSlash(p)) {
				return nil, fmt.Errorf("%s line %d: %q is not a path inside testdata/", ManifestName, n, p)
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Unpack makes the files that the manifest of src (a testdata/ folder)
// lists, in a folder under cache named after the manifest and the stored
// files' sizes and times, and returns the folder that holds the unpacked
// testdata/. A folder made before for the same files is reused; one is
// built whole in a temporary folder and then renamed into place, so test
// binaries that unpack at the same time never see half a set.
func Unpack(src, cache string) (string, error) {
	mb, err := os.ReadFile(filepath.Join(src, ManifestName))
	if err != nil {
		return "", fmt.Errorf("reading the test data's manifest: %w (the repository's testdata/ folder is incomplete)", err)
	}
	entries, err := ParseManifest(mb)
	if err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	key := sha256.New()
	key.Write(mb)
	for _, e := range entries {
		for _, s := range e.stored() {
			st, err := os.Stat(filepath.Join(src, s))
			if err != nil {
				return "", fmt.Errorf("test data for %s: %w", e.Path, err)
			}
			fmt.Fprintf(key, "%s %d %d\n", s, st.Size(), st.ModTime().UnixNano())
		}
	}
	name := hex.EncodeToString(key.Sum(nil))[:20]
	dest := filepath.Join(cache, name)
	if st, err := os.Stat(dest); err == nil && st.IsDir() {
		return dest, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("unpacking the test data: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, name+".tmp-")
	if err != nil {
		return "", fmt.Errorf("unpacking the test data: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename; left over only on failure
	for _, e := range entries {
		if err := unpackOne(src, filepath.Join(tmp, "testdata"), e); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dest); err != nil {
		if st, serr := os.Stat(dest); serr == nil && st.IsDir() {
			return dest, nil // another test binary unpacked the same set first
		}
		return "", fmt.Errorf("unpacking the test data: %w", err)
	}
	prune(cache, name)
	return dest, nil
}

// unpackOne makes one entry's file under out and checks its SHA-256.
func unpackOne(src, out string, e Entry) error {
	dst := filepath.Join(out, filepath.FromSlash(e.Path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("unpacking %s: %w", e.Path, err)
	}
	in := func(p string) string { return filepath.Join(src, filepath.FromSlash(p)) }
	var err error
	switch e.Op {
	case OpCopy:
		err = linkOrCopy(in(e.Path), dst)
	case OpGunzip:
		var b []byte
		if b, err = gunzipFile(in(e.Args[0])); err == nil {
			err = os.WriteFile(dst, b, 0o644)
		}
	case OpBF16XOR:
		var base, delta []byte
		if base, err = os.ReadFile(filepath.Join(out, filepath.FromSlash(e.Args[0]))); err != nil {
			err = fmt.Errorf("%w (list %s before %s in the manifest)", err, e.Args[0], e.Path)
			break
		}
		if delta, err = gunzipFile(in(e.Args[1])); err == nil {
			var b []byte
			if b, err = ApplyBF16XOR(base, delta); err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("unpacking testdata/%s: %w", e.Path, err)
	}
	sum, err := FileSHA256(dst)
	if err != nil {
		return fmt.Errorf("unpacking testdata/%s: %w", e.Path, err)
	}
	if sum != e.SHA256 {
		return fmt.Errorf("testdata/%s unpacks to SHA-256 %s, but the manifest says %s: the stored files changed without the manifest (go run ./tools/testdata writes both)", e.Path, sum, e.SHA256)
	}
	return nil
}

// prune removes unpacked sets other than keep that are a day old: those of
// earlier checkouts or earlier test data.
func prune(cache, keep string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, d := range entries {
		if d.Name() == keep || strings.HasPrefix(d.Name(), keep+".") {
			continue
		}
		if info, err := d.Info(); err == nil && time.Since(info.ModTime()) > 24*time.Hour {
			os.RemoveAll(filepath.Join(cache, d.Name()))
		}
	}
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func gunzipFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// FileSHA256 is the SHA-256 of a file's content, in hex.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ErrLength is returned when a bf16xor base and difference differ in size.
var ErrLength = errors.New("bf16xor: base and difference differ in length")

// RoundedBF16 reads b as little-endian 16-bit words and rounds each from
// f16 to bf16 (to nearest, ties to even). Applied to a whole GGUF file it
// turns the f16 tensors into what a conversion of the same f16 values to
// bf16 holds; the header and f32 tensors come out scrambled, which the
// stored difference undoes.
func RoundedBF16(b []byte) []byte {
	out := make([]byte, len(b))
	for i := 0; i+1 < len(b); i += 2 {
		binary.LittleEndian.PutUint16(out[i:], f16ToBF16(binary.LittleEndian.Uint16(b[i:])))
	}
	if len(b)%2 == 1 {
		out[len(b)-1] = b[len(b)-1]
	}
	return out
}

// ApplyBF16XOR is RoundedBF16(base) XOR delta: a bf16 model rebuilt from
// the f16 model of the same weights and a difference that is mostly zeros
// (the bf16 file was rounded from the f32 originals, so a few values in
// sixteen round the other way).
func ApplyBF16XOR(base, delta []byte) ([]byte, error) {
	if len(base) != len(delta) {
		return nil, fmt.Errorf("%w: %d and %d bytes", ErrLength, len(base), len(delta))
	}
	out := RoundedBF16(base)
	for i := range out {
		out[i] ^= delta[i]
	}
	return out, nil
}

// f16ToBF16 converts an IEEE half to bfloat16, rounding to nearest even;
// a NaN stays a (quiet) NaN.
func f16ToBF16(h uint16) uint16 {
	f := math.Float32bits(f16ToF32(h))
	if f&0x7fffffff > 0x7f800000 {
		return uint16(f>>16) | 0x40
	}
	return uint16((f + 0x7fff + (f>>16)&1) >> 16)
}

func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	v := float32(man) * (1.0 / (1 << 24)) // subnormal: man × 2⁻²⁴, exact in f32
	if sign != 0 {
		v = -v
	}
	return v
}

// WalkStored lists the regular files under dir, relative and with forward
// slashes.
func WalkStored(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	return out, err
}
