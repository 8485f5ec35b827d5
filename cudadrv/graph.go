package cudadrv

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Symbols of CUDA graphs and stream capture.
//
// A decode step is hundreds of small launches; launched one by one each
// costs several µs of host time, while a graph replays them all with one
// cuGraphLaunch. A captured graph freezes kernel parameters, so values that
// change every step (position, sequence length) belong in device memory
// that the kernels read and a copy before the replay updates.
var (
	// CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
	cuStreamBeginCapture = cuSym("cuStreamBeginCapture_v2")
	// CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
	cuStreamEndCapture = cuSym("cuStreamEndCapture")
	// CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus);
	cuStreamIsCapturing = cuSym("cuStreamIsCapturing")
	// CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
	cuGraphInstantiateWithFlags = cuSym("cuGraphInstantiateWithFlags")
	// CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
	cuGraphUpload = cuSym("cuGraphUpload")
	// CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
	cuGraphLaunch = cuSym("cuGraphLaunch")
	// CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
	cuGraphExecDestroy = cuSym("cuGraphExecDestroy")
	// CUresult cuGraphDestroy(CUgraph hGraph);
	cuGraphDestroy = cuSym("cuGraphDestroy")
	// CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes);
	cuGraphGetNodes = cuSym("cuGraphGetNodes")
)

// CaptureMode is a CUstreamCaptureMode: which other driver calls are
// forbidden while a capture runs.
type CaptureMode uint32

const (
	// CaptureGlobal forbids unsafe calls (cuMemAlloc, synchronous copies)
	// from every thread while any global capture runs.
	CaptureGlobal CaptureMode = 0
	// CaptureThreadLocal forbids them on the capturing OS thread only; in Go,
	// where goroutines change threads between calls, that guarantee means
	// little.
	CaptureThreadLocal CaptureMode = 1
	// CaptureRelaxed forbids nothing. It suits Go best: the captured stream
	// is the unit of work, not the thread.
	CaptureRelaxed CaptureMode = 2
)

// CaptureStatus is a CUstreamCaptureStatus.
type CaptureStatus uint32

const (
	CaptureNone        CaptureStatus = 0
	CaptureActive      CaptureStatus = 1
	CaptureInvalidated CaptureStatus = 2
)

// BeginCapture starts recording the work queued on s into a graph instead of
// running it. s must not be the legacy default stream.
func (s *Stream) BeginCapture(mode CaptureMode) error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false) // the capture's first kernel has no kernel before it
	return cuStreamBeginCapture.call(s.h, uintptr(mode))
}

// EndCapture ends the capture begun on s and returns the recorded graph.
func (s *Stream) EndCapture() (*Graph, error) {
	if err := s.ctx.enter(); err != nil {
		return nil, err
	}
	defer s.ctx.exit()
	var g uintptr
	s.queued(false)
	if err := cuStreamEndCapture.call(s.h, uintptr(unsafe.Pointer(&g))); err != nil {
		return nil, err
	}
	return &Graph{h: g, ctx: s.ctx}, nil
}

// CaptureStatus reports whether s is capturing.
func (s *Stream) CaptureStatus() (CaptureStatus, error) {
	if err := s.ctx.enter(); err != nil {
		return 0, err
	}
	defer s.ctx.exit()
	var st uint32
	err := cuStreamIsCapturing.call(s.h, uintptr(unsafe.Pointer(&st)))
	return CaptureStatus(st), err
}

// Capture records into a graph the work fn queues on s. The capture is
// ended even when fn fails, so the stream stays usable; the error then
// joins fn's and the capture's.
func (s *Stream) Capture(mode CaptureMode, fn func() error) (*Graph, error) {
	if err := s.BeginCapture(mode); err != nil {
		return nil, err
	}
	ferr := fn()
	g, err := s.EndCapture()
	if ferr != nil || err != nil {
		if g != nil {
			_ = g.Destroy()
		}
		return nil, errors.Join(ferr, err)
	}
	return g, nil
}

// Graph is a CUgraph: recorded work, not yet executable.
type Graph struct {
	h         uintptr
	ctx       *Context
	destroyed atomic.Bool
}

// Nodes returns the number of nodes (kernels, copies, ...) in the graph.
func (g *Graph) Nodes() (int, error) {
	if err := g.ctx.enter(); err != nil {
		return 0, err
	}
	defer g.ctx.exit()
	var n uint64
	err := cuGraphGetNodes.call(g.h, 0, uintptr(unsafe.Pointer(&n)))
	return int(n), err
}

// GraphInstantiateFlags are the CUDA_GRAPH_INSTANTIATE_FLAG_* flags.
type GraphInstantiateFlags uint64

const (
	GraphAutoFreeOnLaunch GraphInstantiateFlags = 1
	GraphUpload           GraphInstantiateFlags = 2
	GraphUseNodePriority  GraphInstantiateFlags = 8
)

// Instantiate turns the graph into an executable graph. The Graph may be
// destroyed afterwards; the GraphExec does not depend on it.
func (g *Graph) Instantiate(flags GraphInstantiateFlags) (*GraphExec, error) {
	if err := g.ctx.enter(); err != nil {
		return nil, err
	}
	defer g.ctx.exit()
	var h uintptr
	if err := cuGraphInstantiateWithFlags.call(uintptr(unsafe.Pointer(&h)), g.h, uintptr(flags)); err != nil {
		return nil, fmt.Errorf("instantiating graph: %w", err)
	}
	return &GraphExec{h: h, ctx: g.ctx}, nil
}

// Destroy destroys the graph. Calling it again does nothing.
func (g *Graph) Destroy() error {
	if g == nil || g.destroyed.Swap(true) {
		return nil
	}
	if err := g.ctx.enter(); err != nil {
		return err
	}
	defer g.ctx.exit()
	return cuGraphDestroy.call(g.h)
}

// GraphExec is a CUgraphExec: an instantiated graph, launched as a whole.
type GraphExec struct {
	h         uintptr
	ctx       *Context
	destroyed atomic.Bool
}

// Upload prepares the graph's device resources on s ahead of the first
// launch, so that launch does not pay for them.
func (e *GraphExec) Upload(s *Stream) error {
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	s.queued(false)
	return cuGraphUpload.call(e.h, s.handle())
}

// Launch queues the whole graph on s. A GraphExec runs one launch at a
// time: launches of the same GraphExec are ordered after each other.
func (e *GraphExec) Launch(s *Stream) error {
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	s.queued(false)
	return cuGraphLaunch.call(e.h, s.handle())
}

// Destroy destroys the executable graph. Calling it again does nothing.
func (e *GraphExec) Destroy() error {
	if e == nil || e.destroyed.Swap(true) {
		return nil
	}
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	return cuGraphExecDestroy.call(e.h)
}
