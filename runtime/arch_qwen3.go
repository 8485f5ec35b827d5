package runtime

// qwen3: dense Qwen3. Llama's block (arch_llama.go) with RMSNorm on each Q
// and K head before NeoX rope, and no biases.
func init() {
	registerArch(Arch{Name: "qwen3", Build: func(b *Builder) BufID {
		return llamaFamily(b, attnOpts{qkNorm: true, neox: true})
	}})
}
