//go:build noasm || !amd64

package ops

// amxTiles: the AMX kernels are amd64 assembly.
func amxTiles() bool { return false }
