package runtime

// qwen2: Qwen2 and Qwen2.5. Llama's block (arch_llama.go) with Q/K/V biases
// and NeoX rope.
func init() {
	registerArch(Arch{Name: "qwen2", Build: func(b *Builder) BufID {
		return llamaFamily(b, attnOpts{biases: true, neox: true})
	}})
}
