package model

import "github.com/atsinfer/ats/runtime/ir"

// qwen3: dense Qwen3. Llama's block (arch_llama.go) with RMSNorm on each Q
// and K head before NeoX rope, and no biases.
func init() {
	registerArch(Arch{Name: "qwen3", Build: func(b *ir.Builder) ir.BufID {
		return llamaFamily(b, attnOpts{qkNorm: true, neox: true})
	}})
}
