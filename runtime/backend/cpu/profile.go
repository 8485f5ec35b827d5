package cpu

import (
	"fmt"
	"strings"
	"time"

	"github.com/atsinfer/ats/internal/opstats"
	"github.com/atsinfer/ats/runtime/ir"
)

// opProfile accumulates wall time per op name and batch size
// (Options.Profile): the CPU twin of the device backend's profile, for
// finding where a hybrid step's CPU segments go.
type opProfile struct {
	tab opstats.Table
}

// opName is what the profile calls op: its kind, and for products the
// weight's role (blk.N.ffn_up.weight: ffn_up).
func opName(op *ir.Op) string {
	name := op.Kind.String()
	if op.W != nil && op.Kind != ir.OpMoE {
		role := op.W.Name
		if rest, ok := strings.CutPrefix(role, "blk."); ok {
			if i := strings.IndexByte(rest, '.'); i >= 0 {
				role = rest[i+1:]
			}
		}
		name += " " + strings.TrimSuffix(role, ".weight")
	}
	return name
}

// groupName names ops run together (products of one input): the first's
// name and the others' roles.
func groupName(ops []ir.Op) string {
	name := opName(&ops[0])
	for k := 1; k < len(ops); k++ {
		name += "+" + strings.TrimPrefix(opName(&ops[k]), "matmul ")
	}
	return name
}

func (p *opProfile) add(n int, name string, d time.Duration) { p.tab.Add(n, name, d) }

// step counts a batch of n tokens.
func (p *opProfile) step(n int) { p.tab.Batch(n, 0) }

// report sends the profile to the notes (nothing when it is off).
func (b *Backend) report() {
	if b.prof == nil {
		return
	}
	var w strings.Builder
	b.prof.tab.Report(&w, opstats.Format{
		Header: func(n int, r *opstats.Runs, sum float64) string {
			return fmt.Sprintf("CPU profile, batches of %d tokens: %d batches, %.3f ms of ops per batch", n, r.Batches, sum)
		},
		Per: "per batch", Width: 28,
		Part: func(name string) bool { return strings.Contains(name, partMark) },
	})
	b.notes.Note(strings.TrimRight(w.String(), "\n"))
	b.prof = nil
}

// partMark names the parts of an op timed inside it ("moe > router"):
// they are listed, not added to the batch's total.
const partMark = " > "

// lap adds the time since start to the part name of the op being run
// (n tokens), and returns now; nothing when the profile is off.
func (b *Backend) lap(n int, name string, start time.Time) time.Time {
	if b.prof == nil {
		return start
	}
	now := time.Now()
	b.prof.add(n, name, now.Sub(start))
	return now
}

// lapStart is the start of a part's timing (the zero time when off).
func (b *Backend) lapStart() time.Time {
	if b.prof == nil {
		return time.Time{}
	}
	return time.Now()
}
