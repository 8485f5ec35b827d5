//go:build !noasm

package ops

// archAttn returns level l's tile kernels for the attention (nil: the
// generic ones).
func archAttn(l Level) *attnKernels { return nil }
