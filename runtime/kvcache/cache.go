// Package kvcache keeps the books of the KV cache: which cache rows hold
// which sequence's positions. The rows themselves live with the backend
// that runs each layer's attention; every layer's cache has the same rows,
// so one table per sequence serves them all.
//
// The cache is paged: its rows are blocks of Block positions, and a
// sequence holds a table of blocks, taken as it grows, so any sequence can
// grow into whatever the others leave free, and many users share one
// cache without each being given a fixed slice of it.
//
// A block that a sequence has filled is indexed by its tokens and those of
// every block before it. When the sequence ends, its full blocks stay in
// the cache, reusable, until their room is needed: a later prompt that
// starts with the same tokens (the next turn of a chat, or another user's
// request with the same system prompt) takes them instead of computing
// them again. Two sequences may then hold the same block; a sequence
// never writes into a block it shares (Truncate gives such a block up).
package kvcache

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
)

// DefaultBlock is the positions of a block: the kernels' tiles divide it.
const DefaultBlock = 256

// ErrFull is returned when the cache has no room for a sequence's next
// positions.
var ErrFull = errors.New("the KV cache is full")

// Cache is the book of a KV cache of Blocks()*Block() rows. It is not safe
// for concurrent use.
type Cache struct {
	block  int
	limit  int // the most positions a sequence may hold: the rows asked for
	blocks []blockInfo
	free   []int32 // blocks holding nothing, taken from the end
	// cached are blocks no sequence holds whose tokens are indexed, the
	// least recently used first: taken when free runs out.
	cached []int32
	index  map[uint64]int32 // chain hash of a full block -> the block
	seed   maphash.Seed
	open   int // sequences not closed
}

type blockInfo struct {
	refs   int32   // sequences holding the block
	hash   uint64  // the chain hash of its tokens, when indexed
	tokens []int32 // when indexed: its tokens, to check a match
	prev   int32   // when indexed: the block before it in its chain (-1: first)
}

// New makes the book of a cache of at least rows rows in blocks of block
// positions (DefaultBlock when 0). A sequence may hold at most rows
// positions; all of them together, whole blocks.
func New(rows, block int) (*Cache, error) {
	if block <= 0 {
		block = DefaultBlock
	}
	if rows <= 0 {
		return nil, fmt.Errorf("kvcache: %d rows", rows)
	}
	n := (rows + block - 1) / block
	c := &Cache{block: block, limit: rows, blocks: make([]blockInfo, n), index: map[uint64]int32{}, seed: maphash.MakeSeed()}
	for b := n - 1; b >= 0; b-- {
		c.free = append(c.free, int32(b))
	}
	return c, nil
}

// Block is the positions of a block.
func (c *Cache) Block() int { return c.block }

// Blocks is the number of blocks.
func (c *Cache) Blocks() int { return len(c.blocks) }

// Rows is the cache's rows: Blocks()*Block().
func (c *Cache) Rows() int { return len(c.blocks) * c.block }

// Limit is the most positions one sequence may hold: the rows asked for.
func (c *Cache) Limit() int { return c.limit }

// Usage counts blocks: held by sequences, kept for reuse (indexed, held by
// none), and free.
type Usage struct {
	Held, Cached, Free int
}

// Usage counts the blocks by state.
func (c *Cache) Usage() Usage {
	u := Usage{Cached: len(c.cached), Free: len(c.free)}
	u.Held = len(c.blocks) - u.Cached - u.Free
	return u
}

// take gives a block for a sequence: a free one, else the least recently
// used cached one (dropped from the index); -1 when none is left.
func (c *Cache) take() int32 {
	if n := len(c.free); n > 0 {
		b := c.free[n-1]
		c.free = c.free[:n-1]
		c.blocks[b].refs = 1
		return b
	}
	if len(c.cached) > 0 {
		b := c.cached[0]
		c.cached = c.cached[1:]
		c.unindex(b)
		c.blocks[b].refs = 1
		return b
	}
	return -1
}

func (c *Cache) unindex(b int32) {
	bi := &c.blocks[b]
	if bi.tokens != nil && c.index[bi.hash] == b {
		delete(c.index, bi.hash)
	}
	bi.hash, bi.tokens, bi.prev = 0, nil, -1
}

// hold adds a holder to block b, taking it off the cached list.
func (c *Cache) hold(b int32) {
	if c.blocks[b].refs == 0 {
		if i := slices.Index(c.cached, b); i >= 0 {
			c.cached = slices.Delete(c.cached, i, i+1)
		}
	}
	c.blocks[b].refs++
}

// drop removes a holder of block b: a block nobody holds is kept for
// reuse when indexed, else freed.
func (c *Cache) drop(b int32) {
	bi := &c.blocks[b]
	if bi.refs--; bi.refs > 0 {
		return
	}
	if bi.tokens != nil {
		c.cached = append(c.cached, b)
		return
	}
	c.free = append(c.free, b)
}

// chain is the hash of a block's tokens after the block whose hash is prev.
func (c *Cache) chain(prev uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	var buf [8]byte
	for i := range 8 {
		buf[i] = byte(prev >> (8 * i))
	}
	h.Write(buf[:])
	for _, t := range tokens {
		h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64()
}

// Seq is one sequence's positions in the cache: its block table and the
// tokens whose keys and values are there.
type Seq struct {
	c      *Cache
	table  []int32
	tokens []int32 // positions 0..len-1
	closed bool
}

// NewSeq starts an empty sequence.
func (c *Cache) NewSeq() *Seq {
	c.open++
	return &Seq{c: c}
}

// Len is the number of positions whose keys and values are in the cache.
func (s *Seq) Len() int { return len(s.tokens) }

// Tokens are the sequence's tokens in the cache (valid until the next call
// that changes it).
func (s *Seq) Tokens() []int32 { return s.tokens }

// Table is the sequence's block table (valid until the next call that
// changes it).
func (s *Seq) Table() []int32 { return s.table }

// Reuse prepares the sequence for a prompt: it keeps the longest prefix of
// the prompt that is already in the cache, its own positions first, then
// full blocks other sequences left indexed, and forgets the rest. At least
// one token of the prompt is left to compute (its logits are wanted). It
// returns the positions kept.
func (s *Seq) Reuse(prompt []int32) int {
	keep := 0
	for keep < len(s.tokens) && keep < len(prompt)-1 && s.tokens[keep] == prompt[keep] {
		keep++
	}
	keep = s.Truncate(keep)
	// Full indexed blocks beyond what the sequence holds.
	B := s.c.block
	if keep%B != 0 {
		return keep
	}
	var prev uint64
	if n := len(s.table); n > 0 {
		bi := s.c.blocks[s.table[n-1]]
		if bi.tokens == nil {
			return keep // its last block is its own, unindexed
		}
		prev = bi.hash
	}
	for keep+B <= len(prompt)-1 {
		toks := prompt[keep : keep+B]
		h := s.c.chain(prev, toks)
		b, ok := s.c.index[h]
		if !ok || !slices.Equal(s.c.blocks[b].tokens, toks) {
			break
		}
		s.c.hold(b)
		s.table = append(s.table, b)
		s.tokens = append(s.tokens, toks...)
		keep += B
		prev = h
	}
	return keep
}

// Truncate forgets every position from n on and returns the positions
// kept: n, or fewer when position n falls inside a block another sequence
// holds too (it never writes into such a block; the caller computes the
// positions from the block's start again). A block of its own that it had
// indexed leaves the index: its tail is about to change.
func (s *Seq) Truncate(n int) int {
	n = min(max(n, 0), len(s.tokens))
	B := s.c.block
	if n%B != 0 {
		switch b := s.table[n/B]; {
		case s.c.blocks[b].refs > 1:
			n = n / B * B
		case s.c.blocks[b].tokens != nil:
			s.c.unindex(b)
		}
	}
	keepBlocks := (n + B - 1) / B
	for _, b := range s.table[keepBlocks:] {
		s.c.drop(b)
	}
	s.table = s.table[:keepBlocks]
	s.tokens = s.tokens[:n]
	return n
}

// Reserve makes room for n more positions: blocks are taken now, so that
// a step never finds the cache full halfway. It returns ErrFull, having
// taken nothing, when there are not enough.
func (s *Seq) Reserve(n int) error {
	if s.closed {
		return errors.New("kvcache: reserve on a closed sequence")
	}
	if len(s.tokens)+n > s.c.limit {
		return fmt.Errorf("%w: %d positions and %d more are past the context of %d", ErrFull, len(s.tokens), n, s.c.limit)
	}
	B := s.c.block
	need := (len(s.tokens)+n+B-1)/B - len(s.table)
	if need <= 0 {
		return nil
	}
	if need > len(s.c.free)+len(s.c.cached) {
		return fmt.Errorf("%w: %d more positions need %d blocks of %d, %d are left", ErrFull, n, need, B, len(s.c.free)+len(s.c.cached))
	}
	for range need {
		s.table = append(s.table, s.c.take())
	}
	return nil
}

// Room is how many more positions the sequence can take now: what its
// blocks hold beyond its length, and every free or reusable block.
func (s *Seq) Room() int {
	B := s.c.block
	return min(len(s.table)*B-len(s.tokens)+(len(s.c.free)+len(s.c.cached))*B, s.c.limit-len(s.tokens))
}

// Append records that the keys and values of tokens are now in the cache,
// at the next positions (reserved before). Blocks it fills are indexed
// for reuse.
func (s *Seq) Append(tokens []int32) error {
	B := s.c.block
	if len(s.tokens)+len(tokens) > len(s.table)*B {
		return fmt.Errorf("kvcache: %d positions appended past the %d reserved", len(tokens), len(s.table)*B-len(s.tokens))
	}
	for _, t := range tokens {
		s.tokens = append(s.tokens, t)
		if len(s.tokens)%B == 0 {
			s.index(len(s.tokens)/B - 1)
		}
	}
	return nil
}

// index enters block k of the table, now full, in the cache's index,
// unless an equal block is there already.
func (s *Seq) index(k int) {
	c := s.c
	b := s.table[k]
	bi := &c.blocks[b]
	if bi.tokens != nil {
		return // reused: indexed already
	}
	var prev uint64
	prevBlock := int32(-1)
	if k > 0 {
		pb := c.blocks[s.table[k-1]]
		if pb.tokens == nil {
			return // the chain before it is not indexed
		}
		prev, prevBlock = pb.hash, s.table[k-1]
	}
	toks := s.tokens[k*c.block : (k+1)*c.block]
	h := c.chain(prev, toks)
	if _, dup := c.index[h]; dup {
		return
	}
	bi.hash, bi.tokens, bi.prev = h, slices.Clone(toks), prevBlock
	c.index[h] = b
}

// Close gives the sequence's blocks back: full indexed ones stay for reuse.
func (s *Seq) Close() {
	if s.closed {
		return
	}
	s.closed = true
	for _, b := range s.table {
		s.c.drop(b)
	}
	s.table, s.tokens = nil, nil
	s.c.open--
}
