package kernels

import (
	"github.com/atsinfer/ats/cudadrv"
)

// Util holds the kernels of util.cu loaded in one context.
type Util struct {
	Module *cudadrv.Module
	spin   *cudadrv.Function
}

// LoadUtil loads util.cu's PTX for the context's device.
func LoadUtil(ctx *cudadrv.Context) (*Util, error) {
	m, err := Load(ctx, "util")
	if err != nil {
		return nil, err
	}
	k := &Util{Module: m}
	if err := lookup(m, map[string]**cudadrv.Function{"spin": &k.spin}); err != nil {
		_ = m.Unload()
		return nil, err
	}
	return k, nil
}

// Unload unloads the module.
func (k *Util) Unload() error { return k.Module.Unload() }

// Spin queues one thread busy for about cycles SM clock cycles on s.
func (k *Util) Spin(s *cudadrv.Stream, cycles int64) error {
	return launch(k.spin, s, cudadrv.D1(1), cudadrv.D1(1), 0, func(a *cudadrv.Args) { a.I64(cycles) })
}
