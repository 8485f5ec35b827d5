package executor

import (
	"time"

	"github.com/atsinfer/ats/runtime/backend"
)

// Policy chooses, step by step, where a decode step's units run beyond the
// layout's resident ones: dynamic promotion (runtime/placement). The
// executor asks it before each decode step and tells it how the step ran;
// it never calls the planner any other way. The policy may make schedules
// with the Context's Promotion and Release.
type Policy interface {
	// Next is the schedule of the next decode step, b.
	Next(b Step) (*Schedule, error)
	// TimeNext says whether the next decode step should be timed on the
	// device (events around every segment and upload: a few microseconds
	// at each of the dozens of hand-overs).
	TimeNext() bool
	// Observe reports a decode step that ran.
	Observe(r StepReport)
	// Close releases the schedules the policy made.
	Close()
}

// Step describes a decode step about to run: its rows (one token of each
// of its sequences), and the positions they attend to, all rows together
// (each row's position: attention's work grows with it).
type Step struct {
	Rows      int
	Positions int
}

// StepReport is how a decode step ran: its schedule, its wall time and the
// part of it in host segments, the device timeline (empty when the step
// was not timed), the weight bytes it uploaded, and whether it captured
// graphs (which makes it slower than the steps that replay them).
type StepReport struct {
	Schedule *Schedule
	Rows     int
	Wall     time.Duration
	OnHost   time.Duration
	Times    backend.Times
	Copied   int64
	Captured bool
}
