// Package synth writes synthetic models: GGUF files with random weights in
// the exact shapes, tensor names, types and metadata of real models
// (Qwen3, Qwen3-MoE, GLM-4, Llama 3), for tests and benchmarks on machines
// that cannot download the real weights. Throughput does not depend on the
// weight values (MoE routing aside), so these stand in for the real files;
// any GGUF runtime loads them.
//
//	st, err := synth.Write("qwen3-14b.gguf", synth.Options{Preset: "qwen3-14b", Layout: "q4_k_m"})
//
// Output is deterministic: the same options and seed give the same bytes,
// whatever the thread count.
package synth

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/atsinfer/ats/gguf"
)

// Options say what to write.
type Options struct {
	Preset string // a preset name (see Presets)
	Layout string // "f32", "f16", "q8_0" or "q4_k_m" (see Layouts); default q4_k_m
	Seed   uint64 // the random stream; the same seed gives the same file
	// Vocab names a GGUF file whose tokenizer.* metadata (tokens, merges,
	// special ids, chat template, ...) the model copies instead of the
	// made-up SentencePiece vocabulary.
	Vocab string
	// Layers, when positive, writes only that many blocks of the preset
	// (the same shapes, block_count set to it): a model small enough to
	// study one layer's speed on a laptop. The Q4_K_M layout's choice of
	// which attn_v/ffn_down take Q6_K counts these layers.
	Layers int
	// Routing is how the MoE routers route (routing.go): RoutingRandom
	// (the default, also "") or RoutingBalanced.
	Routing string
	// Pooling, when set, replaces the preset's pooling type (see
	// Preset.Pooling): "none", "mean", "cls" or "last".
	Pooling string
	Threads int // generator goroutines; 0 means GOMAXPROCS
	// Progress, when set, is called from one goroutine after each chunk is
	// written, with bytes written so far and the file size.
	Progress func(done, total int64)
}

// Stats describe a written model.
type Stats struct {
	Path     string
	Bytes    int64 // file size
	Tensors  int
	Params   int64 // weights, every tensor's elements
	Duration time.Duration
	// Notes says what Write decided that the caller may want to know
	// (vocabulary padding or a vocabulary larger than the preset's).
	Notes []string
}

// chunkBytes is the most data one generator job produces: big enough that
// per-job overhead vanishes, small enough that a few in flight per thread
// keep memory bounded (2·threads + 2 chunk buffers). Chunks seed their own
// random streams, so this is part of the output format; only tests change
// it (to cut small tensors into many chunks).
var chunkBytes = 8 << 20

// model is everything decided before the first byte is written.
type model struct {
	preset  Preset
	layout  string
	kvs     []gguf.KV
	defs    []tensorDef
	infos   []tensorInfo
	gens    []generator
	header  []byte
	dataEnd uint64 // size of the data section, padded to the alignment
	notes   []string
}

// plan resolves the options into a model.
func plan(opt Options) (*model, error) {
	p, err := Lookup(opt.Preset)
	if err != nil {
		return nil, err
	}
	switch {
	case opt.Layers < 0:
		return nil, fmt.Errorf("synth: --layers %d: want a positive count (0: the preset's %d)", opt.Layers, p.Layers)
	case opt.Layers > p.Layers:
		return nil, fmt.Errorf("synth: --layers %d: the preset %s has %d", opt.Layers, p.Name, p.Layers)
	case opt.Layers > 0:
		p.Layers = opt.Layers
	}
	if opt.Pooling != "" {
		i := slices.Index(poolings, opt.Pooling)
		if i < 0 {
			return nil, fmt.Errorf("synth: pooling %q: want one of %s", opt.Pooling, strings.Join(poolings, ", "))
		}
		p.Pooling = i
	}
	layout := opt.Layout
	if layout == "" {
		layout = "q4_k_m"
	}
	ftype, err := fileType(layout)
	if err != nil {
		return nil, err
	}
	m := &model{layout: layout}

	var vocab []gguf.KV
	if opt.Vocab != "" {
		var n int
		var note string
		vocab, n, note, err = fileVocab(opt.Vocab, p.Vocab)
		if err != nil {
			return nil, err
		}
		if note != "" {
			m.notes = append(m.notes, note)
		}
		p.Vocab = n
	} else if vocab, err = madeUpVocab(p.Vocab); err != nil {
		return nil, fmt.Errorf("synth: preset %s: %w", p.Name, err)
	}
	vocab = tokenizerFlags(p, vocab)
	if err := p.validate(); err != nil {
		return nil, err
	}
	if err := checkRouting(opt.Routing, p); err != nil {
		return nil, err
	}
	m.preset = p
	m.kvs = metadata(p, vocab, ftype)
	for i, kv := range m.kvs {
		if kv.Key == "general.name" && opt.Routing == RoutingBalanced {
			m.kvs[i].Value = gguf.String("synthetic " + p.Name + ", balanced routing") // ats inspect shows it
		}
	}

	m.defs = p.tensors()
	var off uint64
	for _, t := range m.defs {
		typ := p.tensorType(t, layout)
		size, err := typ.RowBytes(uint64(t.elements()))
		if err != nil {
			return nil, fmt.Errorf("synth: preset %s, tensor %s: %w", p.Name, t.name, err)
		}
		g, err := newGenerator(t, typ, p)
		if err != nil {
			return nil, fmt.Errorf("synth: preset %s, tensor %s: %w", p.Name, t.name, err)
		}
		if opt.Routing == RoutingBalanced {
			g = balanced(t, typ, g)
		}
		m.infos = append(m.infos, tensorInfo{name: t.name, typ: typ, dims: t.dims, offset: off, size: size})
		m.gens = append(m.gens, g)
		off = alignUp(off + size)
	}
	m.dataEnd = off
	if m.header, err = encodeHeader(m.kvs, m.infos); err != nil {
		return nil, err
	}
	return m, nil
}

// poolings names the pooling types by their value (Preset.Pooling).
var poolings = []string{"none", "mean", "cls", "last"}

// Poolings lists the names Options.Pooling takes.
func Poolings() []string { return slices.Clone(poolings) }

// tokenizerFlags applies the preset's NoBOS and AddEOS to the tokenizer
// metadata, replacing the entries it has.
func tokenizerFlags(p Preset, vocab []gguf.KV) []gguf.KV {
	set := func(key string, v bool) {
		for i, kv := range vocab {
			if kv.Key == key {
				vocab[i].Value = gguf.Bool(v)
				return
			}
		}
		vocab = append(vocab, gguf.KV{Key: key, Value: gguf.Bool(v)})
	}
	if p.NoBOS {
		set("tokenizer.ggml.add_bos_token", false)
	}
	if p.AddEOS {
		set("tokenizer.ggml.add_eos_token", true)
	}
	return vocab
}

// metadata is the model's key-value list, with the keys llama.cpp's
// converter writes for the architecture, in the oracle files' order.
func metadata(p Preset, vocab []gguf.KV, ftype uint32) []gguf.KV {
	a := p.Arch + "."
	u := func(x int) gguf.Value { return gguf.Uint32(uint32(x)) }
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: gguf.String(p.Arch)},
		{Key: "general.name", Value: gguf.String("synthetic " + p.Name)},
		{Key: a + "block_count", Value: u(p.Layers)},
		{Key: a + "context_length", Value: u(p.Context)},
		{Key: a + "embedding_length", Value: u(p.Hidden)},
		{Key: a + "feed_forward_length", Value: u(p.FFN)},
		{Key: a + "attention.head_count", Value: u(p.Heads)},
		{Key: a + "attention.head_count_kv", Value: u(p.KVHeads)},
		{Key: a + "attention.key_length", Value: u(p.HeadDim)},
		{Key: a + "attention.value_length", Value: u(p.HeadDim)},
		{Key: a + "rope.dimension_count", Value: u(p.RopeDim)},
		{Key: a + "rope.freq_base", Value: gguf.Float32(p.RopeBase)},
		{Key: a + "attention.layer_norm_rms_epsilon", Value: gguf.Float32(p.RMSEps)},
	}
	if p.VocabSizeKey {
		kvs = append(kvs, gguf.KV{Key: a + "vocab_size", Value: u(p.Vocab)})
	}
	if p.Pooling != 0 {
		kvs = append(kvs, gguf.KV{Key: a + "pooling_type", Value: u(p.Pooling)})
	}
	kvs = append(kvs, vocab...)
	if p.Experts > 0 {
		kvs = append(kvs,
			gguf.KV{Key: a + "expert_count", Value: u(p.Experts)},
			gguf.KV{Key: a + "expert_used_count", Value: u(p.ExpertsUsed)},
			gguf.KV{Key: a + "expert_feed_forward_length", Value: u(p.ExpertFFN)})
	}
	return append(kvs,
		gguf.KV{Key: "general.quantization_version", Value: gguf.Uint32(2)},
		gguf.KV{Key: "general.file_type", Value: gguf.Uint32(ftype)})
}

// job is one chunk of one tensor: generated by a worker into buf, written
// by the writer in order.
type job struct {
	tensor int
	chunk  int64 // index of the chunk in its tensor (seeds its generator)
	first  int64 // first block of the chunk in the tensor
	buf    []byte
	done   chan struct{}
}

// Write writes a synthetic model to path: first to path.tmp, renamed into
// place once complete, so path never holds half a model.
func Write(path string, opt Options) (Stats, error) {
	start := time.Now()
	m, err := plan(opt)
	if err != nil {
		return Stats{}, err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return Stats{}, fmt.Errorf("synth: %w", err)
	}
	err = m.stream(f, opt.Seed, opt.Threads, opt.Progress)
	// No fsync: a crash of the machine mid-write can leave a renamed but
	// partly written file; synthetic models are cheap to write again and
	// fsync of 9 GiB costs more than writing it.
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("synth: %s: %w", tmp, cerr)
	}
	if err == nil {
		if rerr := os.Rename(tmp, path); rerr != nil {
			err = fmt.Errorf("synth: %w", rerr)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return Stats{}, fmt.Errorf("synth: writing %s (%s, %s): %w", path, m.preset.Name, m.layout, err)
	}
	var params int64
	for _, t := range m.defs {
		params += t.elements()
	}
	return Stats{
		Path:     path,
		Bytes:    int64(len(m.header)) + int64(m.dataEnd),
		Tensors:  len(m.infos),
		Params:   params,
		Duration: time.Since(start),
		Notes:    m.notes,
	}, nil
}

// stream writes the header, then every tensor's data in order. threads
// workers (0: GOMAXPROCS) generate chunks in parallel; this goroutine writes
// them in file order. Chunk buffers come from a bounded pool and the
// dispatcher takes them in file order, so memory stays bounded and the chunk
// the writer waits for always has a buffer (no deadlock).
func (m *model) stream(out io.Writer, seed uint64, threads int, progress func(done, total int64)) error {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	total := int64(len(m.header)) + int64(m.dataEnd)
	w := bufio.NewWriterSize(out, 1<<20)
	if _, err := w.Write(m.header); err != nil {
		return err
	}
	written := int64(len(m.header))

	// Chunk buffers are made on demand, at most nbuf of them, and reused.
	nbuf := 2*threads + 2
	made := 0
	free := make(chan []byte, nbuf)
	jobs := make(chan *job, threads)
	order := make(chan *job, nbuf)
	stop := make(chan struct{})
	defer close(stop)

	// Dispatcher: cut every tensor into chunks, in file order.
	go func() {
		defer close(order)
		defer close(jobs)
		for ti, t := range m.infos {
			info, _ := t.typ.Info()
			bb := int64(info.BlockBytes)
			blocks := int64(t.size) / bb
			per := max(int64(chunkBytes)/bb, 1)
			for c, first := int64(0), int64(0); first < blocks; c, first = c+1, first+per {
				var buf []byte
				select {
				case buf = <-free:
				default:
					if made < nbuf {
						made++
					} else {
						select {
						case buf = <-free:
						case <-stop:
							return
						}
					}
				}
				n := min(per, blocks-first)
				if int64(cap(buf)) < n*bb {
					buf = make([]byte, 0, max(n*bb, min(int64(chunkBytes), 1<<20)))
				}
				j := &job{tensor: ti, chunk: c, first: first, buf: buf[:n*bb], done: make(chan struct{})}
				select {
				case jobs <- j:
				case <-stop:
					return
				}
				select {
				case order <- j:
				case <-stop:
					return
				}
			}
		}
	}()
	for range threads {
		go func() {
			for j := range jobs {
				r := rng{s: chunkSeed(seed, m.infos[j.tensor].name, j.chunk)}
				m.gens[j.tensor].fill(j.buf, j.first, &r)
				close(j.done)
			}
		}()
	}

	var zeros [ggufAlignment]byte
	for j := range order {
		<-j.done
		t := m.infos[j.tensor]
		// Padding between tensors: each starts at its aligned offset.
		if pad := int64(len(m.header)) + int64(t.offset) - written; j.first == 0 && pad > 0 {
			if _, err := w.Write(zeros[:pad]); err != nil {
				return err
			}
			written += pad
		}
		if _, err := w.Write(j.buf); err != nil {
			return err
		}
		written += int64(len(j.buf))
		free <- j.buf[:0]
		if progress != nil {
			progress(written, total)
		}
	}
	if pad := total - written; pad > 0 { // the data section ends aligned, as gguf.Writer leaves it
		if _, err := w.Write(zeros[:pad]); err != nil {
			return err
		}
		written += pad
	}
	if written != total {
		return fmt.Errorf("internal error: wrote %d bytes, planned %d", written, total)
	}
	return w.Flush()
}
