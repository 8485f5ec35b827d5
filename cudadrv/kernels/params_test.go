package kernels

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestParamStructSizes checks, from the committed PTX, that every kernel
// taking one struct by value (MvArgs, AttnParams, DecKVParams) takes as
// many bytes as the Go side lays out: a field added on one side only would
// shift every field after it, and no test without a GPU would see it.
func TestParamStructSizes(t *testing.T) {
	sizeOf := func(f any) int { return reflect.TypeOf(f).Out(0).Len() }
	layouts := []struct {
		prefix string
		bytes  int
	}{
		{"mv_", mvArgsBytes}, {"mvf_", mvArgsBytes}, {"mvt_", mvArgsBytes}, {"mvt2_", mvArgsBytes},
		{"attn_f16_d", sizeOf(attnParams)}, {"attn_dec_e", sizeOf(attnParams)}, {"attn_mma_", sizeOf(attnParams)},
		{"attn_dec_f16_", sizeOf(decKVParams)}, {"attn_dec_q8_0_", sizeOf(decKVParams)}, {"attn_dec_q4_0_", sizeOf(decKVParams)}, {"attn_dec_q8_0i_", sizeOf(decKVParams)}, {"attn_dec1_", sizeOf(decKVParams)},
	}
	entry := regexp.MustCompile(`\.entry (\w+)\(\s*\n\s*\.param \.align \d+ \.b8 \w+_param_0\[(\d+)\]\s*\n\s*\)`)
	files, err := filepath.Glob("ptx/*.compute_90.ptx")
	if err != nil || len(files) == 0 {
		t.Fatalf("no committed PTX in ptx/ (%v)", err)
	}
	checked := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range entry.FindAllStringSubmatch(string(src), -1) {
			name := m[1]
			n, _ := strconv.Atoi(m[2])
			found := false
			for _, l := range layouts {
				if strings.HasPrefix(name, l.prefix) {
					found = true
					if n != l.bytes {
						t.Errorf("%s (%s) takes %d bytes; the Go side lays out %d", name, filepath.Base(f), n, l.bytes)
					}
					break
				}
			}
			if !found {
				t.Errorf("%s (%s) takes a struct of %d bytes that this test does not know: add its Go layout", name, filepath.Base(f), n)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no kernel with a struct parameter found: the PTX's form changed")
	}
	t.Logf("%d kernels' struct parameters match", checked)
}
