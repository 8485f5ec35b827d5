package model

import "github.com/atsinfer/ats/runtime/ir"

// qwen2: Qwen2 and Qwen2.5. Llama's block (arch_llama.go) with Q/K/V biases
// and NeoX rope.
func init() {
	registerArch(Arch{Name: "qwen2", Build: func(b *ir.Builder) ir.BufID {
		return llamaFamily(b, attnOpts{biases: true, neox: true})
	}})
}
