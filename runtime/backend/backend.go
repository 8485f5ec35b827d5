// Package backend is the seam between the executor and the machines that
// compute: the host (the CPU backend, runtime/backend/cpu), which computes
// in host memory, and accelerators (a GPU: runtime/backend/cuda), which
// compute in memory of their own. The executor (runtime/exec) and the
// planner (runtime/placement) see an accelerator only through the
// interfaces here; a second GPU vendor is a package that implements them.
//
// The executor cuts a step's ops into segments, maximal runs of ops on one
// backend. Activations cross between them through mapped pinned host
// memory (HostBuffer): the host computes in it, and the accelerator moves
// rows in and out with its own copy kernels (zero-copy), so crossings
// never wait behind weight traffic.
package backend

import (
	"fmt"
	"time"

	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// Accelerator is an opened device: what the planner asks of it and what
// makes an Exec on it. It is opened once per process by whoever owns it
// (the command line) and passed down.
type Accelerator interface {
	// Name says which device (for reports and profiles).
	Name() string
	// Info are the device's figures the planner keys its profiles by.
	Info() DeviceInfo
	// MemInfo is the device memory free and in total.
	MemInfo() (free, total int64, err error)
	// ProcessMemory is what the device charges this process, and how
	// that was read; ok is false where it cannot be read.
	ProcessMemory() (n int64, how string, ok bool)
	// ContextBytes is the device memory the driver context itself takes
	// (not counted in budgets).
	ContextBytes() int64
	// SupportsKV says whether the device's attention reads a KV cache of
	// type t.
	SupportsKV(t kvcache.Type) bool
	// MultiSequence says whether a step may hold tokens of several
	// sequences, and sequences whose cache blocks are out of order.
	MultiSequence() bool
	// DeviceBytes is the device memory weight w takes when resident.
	DeviceBytes(w *ir.Weight) int64
	// SplitsMoE says whether an expert layer can be split with the host
	// (ExecConfig.Split) by this device's weight kernels.
	SplitsMoE() bool
	// Need is the device memory an Exec of cfg would allocate: its arena
	// (activations, KV caches, scratch, staging ring) and the resident
	// weights (0 when another Exec of the program holds them already).
	Need(p *ir.Program, cfg ExecConfig) (arena, weights int64)
	// RingBytes is the staging ring an Exec of cfg makes (0: none).
	RingBytes(p *ir.Program, cfg ExecConfig) int64
	// NewExec makes an Exec of program p; host computes the host's share
	// of expert layers split with the device (nil: none split).
	NewExec(p *ir.Program, cfg ExecConfig, host Host) (Exec, error)
	// HostBuffer allocates n floats of mapped pinned host memory, in which
	// the host computes the activations that cross.
	HostBuffer(n int) (HostBuffer, error)
	// MeasureSwitch times moving n floats to the host and back as the
	// executor does (seconds one way, the median of reps).
	MeasureSwitch(n, reps int) (float64, error)
	// MeasureUpload times copying src (a part of files) to the device, as
	// weights stream, and says whether it read page-locked memory.
	MeasureUpload(src []byte, files [][]byte, reps int) (bytesPerSec float64, pinned bool, err error)
}

// DeviceInfo describes a device.
type DeviceInfo struct {
	Name     string
	Memory   int64  // bytes
	L2Cache  int64  // bytes
	Driver   string // the driver's version
	Compute  string // compute capability or equivalent
	Identity string // what tells two devices of one name apart
}

// ExecConfig describes what an Exec may run. Sets are by op index or by
// weight; nil sets are empty.
type ExecConfig struct {
	Batch     int // most tokens a step computes
	LogitRows int // rows of the logits buffer (at most Batch)
	// KV is the cache every layer whose attention runs here keeps.
	KV   model.KV
	Runs []bool // by op: may run here (in some schedule)
	Resident,
	Streams map[*ir.Weight]bool // matrices that live here, and that may stream through the ring
	RingBytes int64 // the staging ring wanted (at least twice the largest streamed matrix)
	// RoutedExperts is the most experts a decode step's routed expert
	// layer (SplitRouted) hands the device, which copies their weights
	// into a scratch of that many experts; RoutedShare is the share of a
	// step's routed experts it takes (the rest stay with the host): where
	// each step size starts, unless RoutedFixed, from which each routed
	// layer moves it toward the share with which the host and the device
	// finish together.
	RoutedExperts int
	RoutedShare   float64
	RoutedFixed   bool
	Files         [][]byte // the model file's mapping (registered for streaming)
	Options       Options
}

// Options are a device backend's switches, for measurements and
// debugging; the zero value is what ats runs with.
type Options struct {
	NoGraphs   bool   // queue every launch instead of replaying captured graphs
	NoPrefetch bool   // no prefetch of the next decode step's first streamed weights
	NoPDL      bool   // no programmatic dependent launch
	NoSpinSync bool   // wait in the driver instead of polling a mapped word
	NoRegister bool   // never page-lock the model file for streaming
	Profile    bool   // time every launch group and report at Close (to Notes)
	Weights    string // weight kernels: "" (the device's best) or "ref" (float32 reference)
	// DecodeMMA: the fewest decode rows whose quantized products take the
	// GPU's tensor-core kernels where it has them: "" each weight type's
	// own, "0" never, else a count. The setting is the device's.
	DecodeMMA string
	Notes     Notes
}

// Notes receives what a backend has to tell the user (a fallback it took,
// a profile at the end); nil discards them.
type Notes func(string)

// Note sends s to n when n is set.
func (n Notes) Note(s string) {
	if n != nil {
		n(s)
	}
}

// Host is what an accelerator needs of the host backend: the host's share
// of an expert layer split between the two (ExecConfig's splits), computed
// while the device computes the rest.
type Host interface {
	// MoEPartial computes, for n tokens, out[t] = the weighted sum of
	// token t's slots whose expert is below ks (zero when none), from the
	// layer's input x and the device's routing ids, weights ([n][topK]).
	// All are mapped host memory, valid for the call.
	MoEPartial(op *ir.Op, n, ks int, x []float32, ids []int32, weights []float32, out []float32) error
	// Expect readies the host's threads for a share due within d.
	Expect(d time.Duration)
}

// HostBuffer is mapped pinned host memory: the host computes in Floats,
// the device reads and writes it through DevicePtr.
type HostBuffer interface {
	Floats() []float32
	DevicePtr() uint64
	Free() error
}

// Transfer is an activation buffer crossing between the host and the
// device: Host is the mapped memory the host keeps it in.
type Transfer struct {
	Buf  ir.BufID
	Host HostBuffer
}

// SegmentSpec is a run of ops [Lo, Hi) placed on the device, with the
// buffers to bring in from the host before it (In) and to send back after
// it (Out), and whether it ends with the program's logits.
type SegmentSpec struct {
	Lo, Hi  int
	In, Out []Transfer
	Logits  bool
	// Split maps an expert op of the segment to the first expert the
	// device computes: the experts below it are the host's (Host), which
	// computes them meanwhile, and their weights are not streamed. Or to
	// SplitRouted. A segment with splits is never captured in a graph (a
	// graph cannot call the host).
	Split map[int]int
}

// SplitRouted marks an expert op of a decode step whose experts stay in
// host memory: each step, once the device has routed the tokens, the host
// hands it a share of the experts they chose (ExecConfig.RoutedShare),
// whose weights alone cross the link, and computes the others meanwhile.
// The expert stack never streams whole.
const SplitRouted = -1

// Schedule is a step's device segments, compiled.
type Schedule interface {
	Segments() []Segment
	// Fits says whether the streamed weights fit the ring side by side,
	// so that only the first of a run of steps copies them.
	Fits() bool
	Release() error
}

// Segment is a compiled SegmentSpec.
type Segment interface {
	Spec() SegmentSpec
}

// Exec is an accelerator's side of one executor: its buffers, its KV
// caches, its staging ring and the compiled schedules.
type Exec interface {
	// Compile compiles a schedule's segments; streams are the matrices
	// its segments stream through the ring.
	Compile(specs []SegmentSpec, streams map[*ir.Weight]bool) (Schedule, error)
	// Begin starts a step of batch b under schedule s.
	Begin(s Schedule, b *ir.Batch) error
	// Run queues segment seg of the step at rows rows and returns the
	// rows it leaves (the output head keeps the batch's logits rows).
	Run(seg Segment, rows int) (int, error)
	// Sync waits for everything queued.
	Sync() error
	// Logits copies the step's rows rows of logits into dst (after Sync),
	// or returns them in place when rows is 1 (valid until the next step).
	Logits(dst []float32, rows int) ([]float32, error)
	// ReadBuffer copies the first len(dst) floats of buffer id (after
	// Sync): the hidden rows of a Batch.Hidden step.
	ReadBuffer(id ir.BufID, dst []float32) error

	// Measure turns on the timing of steps (Times).
	Measure(on bool)
	// Times is the last step's device timeline (with Measure, after Sync).
	Times() (Times, error)
	// Captured is how many decode graphs have been captured so far.
	Captured() int
	// Streamed is the weight bytes streamed so far (any goroutine).
	Streamed() int64
	// Prefetched is the bytes of this step's streamed weights that the
	// step before queued.
	Prefetched() int64
	// Split counts the expert layers split with the host so far.
	Split() SplitStats
	// Pinned says whether streamed weights are read from page-locked
	// memory (copied: bytes copied into pinned memory), and why not.
	Pinned() (ok bool, copied int64, why string)
	// Bytes is the device memory the Exec allocated, and its share of
	// the resident weights.
	Bytes() (arena, weights int64)
	// WriteBuffer fills the device rows of buffer id from v (the profile
	// feeds realistic activations, so routing and softmax see real
	// numbers).
	WriteBuffer(id ir.BufID, v []float32) error
	// TimeRun runs seg like Run and returns the device time it took (the
	// kernels and transfers, not the host's launch or wait latency).
	TimeRun(seg Segment, rows int) (time.Duration, error)
	// Close frees what the Exec holds.
	Close() error
}

// Span is a stretch of device time, in seconds from the step's start.
type Span struct {
	Name       string
	Lo, Hi     int // segments: the ops
	Start, End float64
	Bytes      int64 // uploads: the bytes copied
	Streams    bool  // segments: whether it read streamed weights
}

// Times are one step's device timeline: the segments on the compute
// stream and the uploads on the copy stream, and the host's stretches
// inside the segments (on its own clock).
type Times struct {
	Segments []Span
	Uploads  []Span
	Host     []HostSpan
}

// HostSpan is a stretch of the host's time inside a device segment.
type HostSpan struct {
	Name       string
	Start, End time.Time
}

// SplitStats count the expert layers split with the host so far: how many,
// the host's time waiting for their routing, and its time computing its
// share; the slots (token, expert) they routed, and how many the host's
// experts took; the host's experts, and how many of them had a slot; the
// process's CPU time during the host's shares; and the file bytes of the
// host's experts that had a slot. The routed layers of decode steps
// (SplitRouted) count apart: how many, the experts the device took and the
// host's that had a slot, the bytes the device's brought over the link,
// and the host's time waiting for their routing and computing its share.
type SplitStats struct {
	Layers                  int
	Wait, Host              time.Duration
	Slots, HostSlots        int
	HostExperts, HostRouted int
	HostCPU                 time.Duration
	HostBytes               int64
	RoutedLayers            int
	DeviceExperts           int
	RoutedHostExperts       int
	CopiedBytes             int64
	RoutedWait, RoutedHost  time.Duration
}

// RouteRecord is the routing of one MoE op for one batch, as a backend
// hands it to a RouteInspector (tests): MoE routing is a discrete choice,
// so a small numerical difference upstream can send a token to another
// expert when two router probabilities are nearly tied, and the oracle
// tests count such flips and can impose one backend's choice on another.
type RouteRecord struct {
	Op, Layer     int // the op's index in the program, its layer
	Pos0          int // the position of the batch's first token
	NTok          int
	NExpert, TopK int
	Logits        []float32 // [NTok][NExpert]: the router's logits
	IDs           []int32   // [NTok][TopK]: the chosen experts, in slot order
	Weights       []float32 // [NTok][TopK]: their weights
}

// RouteInspector receives the routing of one MoE op for one batch. It may
// rewrite r.IDs and r.Weights and return true: the op then uses them.
type RouteInspector func(r *RouteRecord) (replace bool)

// CheckImposed says whether r's IDs and Weights, rewritten by an
// inspector, are a routing the op can use.
func (r *RouteRecord) CheckImposed() error {
	if n := r.NTok * r.TopK; len(r.IDs) != n || len(r.Weights) != n {
		return fmt.Errorf("route inspection: %d ids and %d weights to impose, want %d", len(r.IDs), len(r.Weights), n)
	}
	for _, id := range r.IDs {
		if id < 0 || int(id) >= r.NExpert {
			return fmt.Errorf("route inspection: expert %d imposed, of %d", id, r.NExpert)
		}
	}
	return nil
}
