package kernels

import (
	"github.com/atsinfer/ats/cudadrv"
)

// Util holds the kernels of util.cu for one context.
type Util struct {
	lazyModule
	spin *cudadrv.Function
}

// NewUtil prepares util.cu's kernels for the context's device; the module
// loads at the first launch.
func NewUtil(ctx *cudadrv.Context) (*Util, error) {
	k := &Util{}
	err := k.prepareLookup(ctx, "util", map[string]**cudadrv.Function{
		"spin": &k.spin,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadUtil is NewUtil with the module loaded now.
func LoadUtil(ctx *cudadrv.Context) (*Util, error) { return loadNow(NewUtil(ctx)) }

// Spin queues one thread busy for about cycles SM clock cycles on s.
func (k *Util) Spin(s *cudadrv.Stream, cycles int64) error {
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.spin, s, cudadrv.D1(1), cudadrv.D1(1), 0, func(a *cudadrv.Args) { a.I64(cycles) })
}
