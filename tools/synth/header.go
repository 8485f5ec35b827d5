package synth

import "github.com/atsinfer/ats/gguf"

// synth streams every tensor in chunks of a few MiB (an f32 output matrix of
// Qwen3-14B is 3.1 GB), so it writes the header itself, encoded by
// gguf.EncodeHeader exactly as gguf.Writer would, and needs it up front to
// know the file size.

const ggufAlignment = gguf.DefaultAlignment // general.alignment is not set

// tensorInfo is a tensor's header entry.
type tensorInfo struct {
	name   string
	typ    gguf.Type
	dims   []uint64
	offset uint64 // from the start of the data section
	size   uint64
}

// encodeHeader encodes the header of a GGUF v3 file (magic, version,
// counts, metadata, tensor infos) and pads it to the data section.
func encodeHeader(kvs []gguf.KV, tensors []tensorInfo) ([]byte, error) {
	infos := make([]gguf.TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = gguf.TensorInfo{Name: t.name, Type: t.typ, Dims: t.dims, Offset: t.offset, Size: t.size}
	}
	return gguf.EncodeHeader(3, kvs, infos)
}

func alignUp(n uint64) uint64 { return (n + ggufAlignment - 1) / ggufAlignment * ggufAlignment }
