package cpu

import (
	"fmt"
	"sync"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// Weights are the CPU's matrices of a program's weights: views of the
// model file's blocks, some of which get repacked copies (ops.Matrix.Repack:
// 16 rows a block, read by kernels that multiply many rows by many tokens
// at once), which make CPU prefill about twice as fast and decode about
// 1.5 times, at the cost of the copy on the heap. Which weights to repack
// is the planner's policy (runtime/placement); the copies are made here,
// and shared by every backend of the model that computes with them.
type Weights struct {
	prog *ir.Program
	mats []*Mat // by Weight.ID; nil for vectors

	mu       sync.Mutex
	repacked int64 // heap bytes of the repacked copies
	// packedExperts is, for an expert stack repacked in part, how many of
	// its first experts have copies.
	packedExperts map[*ir.Weight]int
	users         int // backends computing with the matrices
	// NoRepack keeps every matrix in the file's blocks (for measuring the
	// repacked kernels' gain).
	NoRepack bool
	// RepackAll gives a hybrid context's host matrices repacked copies
	// whatever the host memory they take (RepackHybrid's allowance).
	RepackAll bool
	// AvailableMemory is what host memory new allocations could take when
	// the context was planned (0: unknown); RepackHybrid's allowance grows
	// into it.
	AvailableMemory int64
	Notes           backend.Notes
	noted           bool
}

// Mat is a weight's matrix on the CPU, and for an expert stack one matrix
// per expert (slices of it, or of their repacked copies).
type Mat struct {
	ops.Matrix
	Stack []ops.Matrix
}

// NewWeights makes the CPU's view of p's weights. A weight of a type ats
// has no kernel for is an error naming it.
func NewWeights(p *ir.Program) (*Weights, error) {
	ws := &Weights{prog: p, mats: make([]*Mat, len(p.Weights))}
	for _, w := range p.Weights {
		if w.IsVector() {
			continue
		}
		m, err := fileMat(w)
		if err != nil {
			return nil, err
		}
		ws.mats[w.ID] = m
	}
	return ws, nil
}

// fileMat is w's matrix over the file's blocks.
func fileMat(w *ir.Weight) (*Mat, error) {
	k, err := ops.KernelFor(w.Type)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", w.Name, err)
	}
	m, err := ops.NewMatrix(k, w.Rows(), w.Cols(), w.Data)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", w.Name, err)
	}
	return &Mat{Matrix: m, Stack: stackOf(m, w.Experts())}, nil
}

// stackOf slices a stacked tensor's matrix into its n experts (nil for
// n 0).
func stackOf(mat ops.Matrix, n int) []ops.Matrix {
	if n == 0 {
		return nil
	}
	out := make([]ops.Matrix, n)
	per := mat.Rows / n
	for e := range out {
		out[e] = mat.Slice(e*per, (e+1)*per)
	}
	return out
}

// Of is w's matrix (nil for a vector).
func (ws *Weights) Of(w *ir.Weight) *Mat { return ws.mats[w.ID] }

// Program is the program the weights are of.
func (ws *Weights) Program() *ir.Program { return ws.prog }

// enter and leave count the backends computing with the matrices: a
// repack swaps the matrices such a backend reads as it computes.
func (ws *Weights) enter() {
	ws.mu.Lock()
	ws.users++
	ws.mu.Unlock()
}

func (ws *Weights) leave() {
	ws.mu.Lock()
	ws.users--
	ws.mu.Unlock()
}

// Repackable says whether w has a repacked layout at this CPU's kernel
// level.
func (ws *Weights) Repackable(w *ir.Weight) bool {
	m := ws.Of(w)
	return m != nil && m.Kernel != nil && m.RepackSize() > 0
}

// RepackSize is the heap a repacked copy of w takes (0: no layout).
func (ws *Weights) RepackSize(w *ir.Weight) int64 {
	if m := ws.Of(w); m != nil {
		return int64(m.RepackSize())
	}
	return 0
}

// SharedActivations says whether the products of a and b read their input
// in one activation format (quantized once for both).
func (ws *Weights) SharedActivations(a, b *ir.Weight) bool {
	ma, mb := ws.Of(a), ws.Of(b)
	return ma != nil && mb != nil && ma.Kernel.ActType == mb.Kernel.ActType
}

// RepackedBytes is the heap the repacked copies take.
func (ws *Weights) RepackedBytes() int64 {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.repacked
}

// RepackedExperts is the fewest and the most first experts of an expert
// stack that have repacked copies while the stack itself does not (0, 0:
// none).
func (ws *Weights) RepackedExperts() (lo, hi int) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	lo = -1
	for _, p := range ws.packedExperts {
		if lo < 0 || p < lo {
			lo = p
		}
		hi = max(hi, p)
	}
	return max(lo, 0), hi
}

// PackedShare is the fraction of w's bytes the CPU reads from repacked
// copies: all of a matrix repacked whole, the first experts' share of a
// stack repacked in part.
func (ws *Weights) PackedShare(w *ir.Weight) float64 {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.packedShare(w)
}

func (ws *Weights) packedShare(w *ir.Weight) float64 {
	m := ws.Of(w)
	if m == nil {
		return 0
	}
	if m.RepackedBytes() > 0 {
		return 1
	}
	if ne := len(m.Stack); ne > 0 {
		return float64(ws.packedExperts[w]) / float64(ne)
	}
	return 0
}

// PackedExperts is how many of stack w's first experts have repacked
// copies (the stack not being repacked whole).
func (ws *Weights) PackedExperts(w *ir.Weight) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.packedExperts[w]
}

// Repacked says whether w is repacked whole.
func (ws *Weights) Repacked(w *ir.Weight) bool {
	m := ws.Of(w)
	return m != nil && m.RepackedBytes() > 0
}

// Choose is what Repack(ws, nil, 0) would repack of list now: in order,
// each weight that has a repacked layout and no copy yet, while the copies
// stay within limit bytes (negative: no limit; a matrix larger than what
// is left is passed over, a smaller one after it may still fit); nothing
// with NoRepack.
func (ws *Weights) Choose(list []*ir.Weight, limit int64) []*ir.Weight {
	if ws.NoRepack {
		return nil
	}
	var out []*ir.Weight
	seen := map[*ir.Weight]bool{}
	for _, w := range list {
		m := ws.Of(w)
		if w == nil || m == nil || seen[w] || m.RepackedBytes() > 0 || (limit >= 0 && w.Bytes() > limit) {
			continue
		}
		size := int64(m.RepackSize())
		if size == 0 {
			continue
		}
		seen[w] = true
		out = append(out, w)
		limit -= size
	}
	return out
}

// Repack gives each of whole a repacked copy, and the first experts
// experts of each of stacks, unless another backend computes with the
// matrices now (then it says so once, and the CPU keeps reading the file's
// blocks). It returns the heap all copies take.
func (ws *Weights) Repack(whole, stacks []*ir.Weight, experts int) int64 {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.NoRepack || len(whole)+len(stacks) == 0 {
		return ws.repacked
	}
	if ws.users > 0 {
		if !ws.noted {
			ws.noted = true
			ws.Notes.Note("another context of this model is computing: its weights are not repacked now, and this context's CPU runs them from the file's blocks (slower)")
		}
		return ws.repacked
	}
	for _, w := range whole {
		m := ws.Of(w)
		r, ok := m.Repack()
		if !ok {
			continue
		}
		m.Matrix = r
		ws.repacked += int64(r.RepackedBytes())
		if n := len(m.Stack); n > 0 {
			copy(m.Stack, stackOf(r, n))
		}
	}
	for _, w := range stacks {
		ws.repackExperts(w, experts)
	}
	return ws.repacked
}

// repackExperts gives the first p experts of stack w repacked copies (those
// it has not already), each expert's matrix reading its copy; the whole
// stack's matrix stays in the file's layout. The caller holds mu.
func (ws *Weights) repackExperts(w *ir.Weight, p int) {
	m := ws.Of(w)
	ne := len(m.Stack)
	have := ws.packedExperts[w]
	p = min(p, ne)
	if p <= have || ne == 0 || m.Rows%ne != 0 {
		return
	}
	rows := m.Rows / ne
	r, ok := m.Slice(have*rows, p*rows).Repack()
	if !ok {
		return
	}
	for e := have; e < p; e++ {
		m.Stack[e] = r.Slice((e-have)*rows, (e-have+1)*rows)
	}
	ws.repacked += int64(r.RepackedBytes())
	if ws.packedExperts == nil {
		ws.packedExperts = map[*ir.Weight]int{}
	}
	ws.packedExperts[w] = p
}

// Layout points the matrices of list at the file's blocks (packed false)
// or at repacked copies made now, and returns what restores them: the
// profile times each layout on weights of its own (a Weights no context
// uses).
func (ws *Weights) Layout(list []*ir.Weight, packed bool) (restore func()) {
	saved := map[*ir.Weight]Mat{}
	var todo []*ir.Weight
	for _, w := range list {
		m := ws.Of(w)
		if m == nil || m.Kernel == nil {
			continue
		}
		if _, ok := saved[w]; ok {
			continue
		}
		saved[w] = Mat{Matrix: m.Matrix, Stack: append([]ops.Matrix(nil), m.Stack...)}
		switch {
		case !packed && m.RepackedBytes() > 0:
			m.Matrix = m.Unpacked()
			m.Stack = stackOf(m.Matrix, len(m.Stack))
		case !packed && len(m.Stack) > 0 && m.Stack[0].RepackedBytes() > 0:
			m.Stack = stackOf(m.Matrix, len(m.Stack))
		case packed && m.RepackedBytes() == 0 && m.RepackSize() > 0:
			todo = append(todo, w)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, ops.DefaultThreads())
	for _, w := range todo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m := ws.Of(w)
			if r, ok := m.Repack(); ok {
				m.Matrix = r
				m.Stack = stackOf(r, len(m.Stack))
			}
		})
	}
	wg.Wait()
	return func() {
		for w, s := range saved {
			*ws.Of(w) = s
		}
	}
}
