package cuda

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// A step's input on the device: the batch's token ids, positions,
// sequences, the rows whose logits are wanted, and every sequence's KV
// block table, at fixed places (int32 words), so that a CUDA graph
// captured for a batch size replays at any positions and tables: the
// host writes the step's values into pinned memory and the first segment
// copies them up.
type inputLayout struct {
	tokens, pos, seq, logits, tables int // offsets in words
	maxSeqs, maxBlocks               int // the tables: maxSeqs rows of maxBlocks
	words                            int
}

func newInputLayout(cfg backend.ExecConfig) inputLayout {
	B := max(cfg.Batch, 1)
	l := inputLayout{maxSeqs: B, maxBlocks: max(1, (cfg.KV.Rows+kvcache.DefaultBlock-1)/kvcache.DefaultBlock)}
	l.tokens, l.pos, l.seq, l.logits = 0, B, 2*B, 3*B
	l.tables = 3*B + max(cfg.LogitRows, 1)
	l.words = l.tables + l.maxSeqs*l.maxBlocks
	return l
}

// stepPlan is how a step's attention runs: its first decode rows (one
// token of each of their sequences) in one launch, the prompt chunks one
// sequence at a time.
type stepPlan struct {
	decode int // rows [0, decode) are decode rows
	// short: every decode row is at a position below
	// kernels.DecodeShortRow (DecodeKVArgs.Short; decode graphs are kept
	// apart by it).
	short  bool
	chunks []chunk
}

// chunk is rows [lo, hi) of one sequence, whose first cell is first when
// its blocks lie in order from it up to its last position (then the
// prefill kernels read the cache itself; -1 otherwise).
type chunk struct {
	lo, hi int
	first  int
}

// setInput writes batch b into the pinned input and plans its attention.
func (g *Exec) setInput(b *ir.Batch) error {
	l := g.inLay
	if len(b.Tables) > l.maxSeqs {
		return fmt.Errorf("gpu: a step of %d sequences; the input holds %d", len(b.Tables), l.maxSeqs)
	}
	if len(b.Logits) > g.cfg.LogitRows && !b.Hidden {
		return fmt.Errorf("gpu: %d rows of logits wanted; the buffer holds %d", len(b.Logits), g.cfg.LogitRows)
	}
	if b.Block != kvcache.DefaultBlock {
		return fmt.Errorf("gpu: KV blocks of %d positions; the kernels take %d", b.Block, kvcache.DefaultBlock)
	}
	in := unsafe.Slice((*int32)(g.in.Pointer()), l.words)
	copy(in[l.tokens:], b.Tokens)
	copy(in[l.pos:], b.Pos)
	copy(in[l.seq:], b.Seq)
	copy(in[l.logits:l.tables], b.Logits)
	for s, t := range b.Tables {
		if len(t) > l.maxBlocks {
			return fmt.Errorf("gpu: sequence %d of the step has %d blocks; the cache holds %d", s, len(t), l.maxBlocks)
		}
		copy(in[l.tables+s*l.maxBlocks:], t)
	}
	g.plan.set(b, g.cfg.LogitRows, g.kvType == kernels.KVF16)
	return nil
}

// set plans batch b's attention: its leading single tokens (up to
// logitRows) as decode rows, every other run of a sequence as a chunk;
// inOrder looks for chunks whose cache blocks lie in order (an f16
// cache's prefill kernels then read the cache itself).
func (p *stepPlan) set(b *ir.Batch, logitRows int, inOrder bool) {
	p.decode, p.short, p.chunks = 0, false, p.chunks[:0]
	leading := true
	b.Runs(func(seq, lo, hi int) {
		// Decode rows share one launch (their partials are sized for
		// LogitRows rows); a step of more single tokens (embeddings) runs
		// the rest as chunks of one.
		if leading && hi-lo == 1 && hi <= logitRows {
			p.decode = hi
			return
		}
		leading = false
		c := chunk{lo: lo, hi: hi, first: -1}
		if inOrder { // f16: the cache itself when the blocks lie in order
			t, last := b.Tables[seq], int(b.Pos[hi-1])
			ordered := true
			for k := 1; k*b.Block <= last && ordered; k++ {
				ordered = t[k] == t[0]+int32(k)
			}
			if ordered {
				c.first = int(t[0]) * b.Block
			}
		}
		p.chunks = append(p.chunks, c)
	})
	if p.decode > 0 {
		p.short = slices.Max(b.Pos[:p.decode]) < kernels.DecodeShortRow
	}
}

// inputBytes are the stretches of the pinned input a step of n tokens of
// nSeq sequences uses: token ids, positions, sequences and logits rows
// together, then the tables.
func (g *Exec) inputBytes(nSeq int) (head, tables []byte) {
	l := g.inLay
	all := g.in.Bytes()
	return all[:4*l.tables], all[4*l.tables : 4*(l.tables+nSeq*l.maxBlocks)]
}

// decodeSplits is the split-K layout of a decode launch of n rows: the
// one-row layout's blocks shared among the rows (more rows fill the
// device with fewer splits each), chunks a multiple of 64 positions that
// cover the cache.
func (g *Exec) decodeSplits(n int) (splits, chunk int) {
	if g.attn.splits <= 1 {
		return 1, 0
	}
	splits = max(1, (g.attn.splits+n-1)/n)
	rows := g.cfg.KV.Rows
	chunk = ((rows+splits-1)/splits + 63) &^ 63
	return (rows + chunk - 1) / chunk, chunk
}
