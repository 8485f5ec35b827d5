package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/ir"
)

// Arch builds the program of one architecture: each arch_*.go file lists
// its ops in order through an ir.Builder.
type Arch struct {
	Name  string
	Build func(b *ir.Builder) (logits ir.BufID)
}

var archs = map[string]Arch{}

func registerArch(a Arch) { archs[a.Name] = a }

// Architectures lists the supported architecture names.
func Architectures() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Build makes the program of f's architecture.
func Build(f *gguf.File) (*ir.Program, error) {
	name, err := f.Arch()
	if err != nil {
		return nil, err
	}
	a, ok := archs[name]
	if !ok {
		return nil, fmt.Errorf("%s: unsupported architecture %q (ats runs: %s)", f.Path, name, strings.Join(Architectures(), ", "))
	}
	h, err := ir.ReadHyper(f)
	if err != nil {
		return nil, err
	}
	b := ir.NewBuilder(f, h)
	return b.Finish(a.Build(b))
}
