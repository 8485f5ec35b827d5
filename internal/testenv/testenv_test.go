package testenv

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSharedDirFromEnv(t *testing.T) {
	d := t.TempDir()
	if err := os.Mkdir(filepath.Join(d, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvShared, d)
	if got := SharedDirOrEmpty(); got != d {
		t.Fatalf("SharedDirOrEmpty() = %q, want %q", got, d)
	}
	t.Setenv(EnvShared, filepath.Join(d, "nope"))
	if got := SharedDirOrEmpty(); got != "" {
		t.Fatalf("SharedDirOrEmpty() with a bad $%s = %q, want empty", EnvShared, got)
	}
}

// The repository's test data unpacks, and everything stored in testdata/
// is either read through the manifest or a README.
func TestRepositoryTestdata(t *testing.T) {
	t.Setenv(EnvShared, "")
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "testdata")
	mb, err := os.ReadFile(filepath.Join(src, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := ParseManifest(mb)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{ManifestName: true}
	for _, e := range entries {
		for _, s := range e.stored() {
			used[s] = true
		}
	}
	stored, err := WalkStored(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range stored {
		if !used[p] && filepath.Base(p) != "README.md" {
			t.Errorf("testdata/%s is stored but no manifest entry reads it", p)
		}
	}
	d := SharedDir(t)
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(d, "testdata", filepath.FromSlash(e.Path))); err != nil {
			t.Errorf("unpacked: %v", err)
		}
	}
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func gz(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	z.Write(b)
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Unpack makes each kind of entry, reuses an unpacked set, and refuses
// stored files that do not match the manifest.
func TestUnpack(t *testing.T) {
	src := t.TempDir()
	plain := []byte("tokens\n")
	json := []byte(`{"prompt":[1,2,3]}`)
	// An f16 "model" of 1.0, 2⁻²⁴ and a value between two bf16 values, and
	// its bf16 twin where the last one rounded the other way.
	base := []byte{0x00, 0x3c, 0x01, 0x00, 0x04, 0x3c}
	bf16 := []byte{0x80, 0x3f, 0x80, 0x33, 0x81, 0x3f}
	delta := RoundedBF16(base)
	for i := range delta {
		delta[i] ^= bf16[i]
	}
	files := map[string][]byte{
		"vocab/a.inp":        plain,
		"oracle/m.json.gz":   gz(t, json),
		"oracle/f16.bin":     base,
		"oracle/bf16.bin.gz": gz(t, delta),
	}
	for p, b := range files {
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifest := strings.Join([]string{
		"# test",
		Entry{hexSum(plain), "vocab/a.inp", OpCopy, nil}.String(),
		Entry{hexSum(json), "oracle/m.json", OpGunzip, []string{"oracle/m.json.gz"}}.String(),
		Entry{hexSum(base), "oracle/f16.bin", OpCopy, nil}.String(),
		Entry{hexSum(bf16), "oracle/bf16.bin", OpBF16XOR, []string{"oracle/f16.bin", "oracle/bf16.bin.gz"}}.String(),
	}, "\n")
	if err := os.WriteFile(filepath.Join(src, ManifestName), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	dir, err := Unpack(src, cache)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][]byte{"vocab/a.inp": plain, "oracle/m.json": json, "oracle/bf16.bin": bf16} {
		got, err := os.ReadFile(filepath.Join(dir, "testdata", p))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", p, diff)
		}
	}
	again, err := Unpack(src, cache)
	if err != nil || again != dir {
		t.Errorf("second Unpack = %q, %v; want the same folder %q", again, err, dir)
	}

	// A stored file changed without the manifest: a clear error.
	if err := os.WriteFile(filepath.Join(src, "vocab/a.inp"), []byte("other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Unpack(src, cache); err == nil || !strings.Contains(err.Error(), "testdata/vocab/a.inp unpacks to SHA-256") {
		t.Errorf("Unpack after a change = %v, want a SHA-256 mismatch for vocab/a.inp", err)
	}
}

func TestParseManifestErrors(t *testing.T) {
	sum := strings.Repeat("a", 64)
	for _, tc := range []struct{ line, want string }{
		{"abc x copy", "not a SHA-256"},
		{sum + " x", "want SHA256 PATH OP"},
		{sum + " x unzip y", "unknown op"},
		{sum + " x gunzip", "takes 1 arguments"},
		{sum + " ../x copy", "not a path inside testdata/"},
	} {
		if _, err := ParseManifest([]byte(tc.line)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.line, err, tc.want)
		}
	}
}

func TestF16ToBF16(t *testing.T) {
	for _, tc := range []struct{ f16, bf16 uint16 }{
		{0x3c00, 0x3f80}, // 1
		{0xc000, 0xc000}, // -2
		{0x0001, 0x3380}, // 2⁻²⁴, the smallest subnormal
		{0x3c04, 0x3f80}, // 1 + 2⁻⁸: a tie, to even (down)
		{0x3c0c, 0x3f82}, // 1 + 3·2⁻⁸: a tie, to even (up)
		{0x7c00, 0x7f80}, // +Inf
		{0x8000, 0x8000}, // -0
	} {
		if got := f16ToBF16(tc.f16); got != tc.bf16 {
			t.Errorf("f16ToBF16(%#04x) = %#04x, want %#04x", tc.f16, got, tc.bf16)
		}
	}
	if got := f16ToBF16(0x7e00); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("NaN became %#04x", got)
	}
}

func TestGlob(t *testing.T) {
	t.Setenv(EnvShared, "")
	if m := Glob(t, "testdata/oracle/long/*-kvq8.logits.json"); len(m) != 4 {
		t.Errorf("%d long-context q8_0 oracles, want 4: %v", len(m), m)
	}
	if m := Glob(t, "testdata/oracle/long/*-kvq4.logits.json"); len(m) != 4 {
		t.Errorf("%d long-context q4_0 oracles, want 4: %v", len(m), m)
	}
}
