package cuda

import (
	"fmt"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// Route inspection, for tests: which experts each MoE op chose for each
// token, read back from the device. MoE routing is a discrete choice, so a
// small numerical difference upstream can send a token to another expert
// when two router probabilities are nearly tied; the oracle tests count
// such flips against the CPU backend's choice (runtime/session's GPU
// tests). The records are backend.RouteRecord, as the CPU backend's.
//
// The inspector may also impose its own choice (the CPU's, say), so that a
// test can compare logits computed with the same routing.
//
// While an inspector is set, every batch runs its launches one by one (no
// decode graph) and each MoE op waits for its routing and copies it back.
// Without one, the MoE step pays a nil check.

// InspectRoutes sets f to receive the routing of every MoE op this Exec
// runs from now on, in execution order (nil: stop). f runs on the calling
// goroutine, inside Run.
func (g *Exec) InspectRoutes(f backend.RouteInspector) { g.routeInspector = f }

// inspectRoute waits for the routing of op over n tokens and hands it to
// the inspector.
func (g *Exec) inspectRoute(s *cudadrv.Stream, op *ir.Op, n int) error {
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("route inspection: %w", err)
	}
	ne, k := matOf(op.W, 0).Rows, op.TopK
	r := backend.RouteRecord{Op: g.prog.OpIndex(op), Layer: op.Layer, NTok: n, NExpert: ne, TopK: k,
		Pos0:    int(g.batch.Pos[0]),
		Logits:  make([]float32, n*ne),
		IDs:     make([]int32, n*k),
		Weights: make([]float32, n*k)}
	ctx := g.dev.ctx
	if err := ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&r.Logits[0])), 4*len(r.Logits)), g.moe.probs); err != nil {
		return fmt.Errorf("route inspection: router logits: %w", err)
	}
	if err := ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&r.IDs[0])), 4*len(r.IDs)), g.moe.ids); err != nil {
		return fmt.Errorf("route inspection: expert ids: %w", err)
	}
	if err := ctx.CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&r.Weights[0])), 4*len(r.Weights)), g.moe.weights); err != nil {
		return fmt.Errorf("route inspection: expert weights: %w", err)
	}
	if !g.routeInspector(&r) {
		return nil
	}
	if err := r.CheckImposed(); err != nil {
		return err
	}
	if err := ctx.CopyHtoD(g.moe.ids, unsafe.Slice((*byte)(unsafe.Pointer(&r.IDs[0])), 4*len(r.IDs))); err != nil {
		return fmt.Errorf("route inspection: imposing expert ids: %w", err)
	}
	if err := ctx.CopyHtoD(g.moe.weights, unsafe.Slice((*byte)(unsafe.Pointer(&r.Weights[0])), 4*len(r.Weights))); err != nil {
		return fmt.Errorf("route inspection: imposing expert weights: %w", err)
	}
	return nil
}
