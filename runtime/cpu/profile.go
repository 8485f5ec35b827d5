package cpu

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/atsinfer/ats/runtime/ir"
)

// EnvCPUProfile set to "1" times every op the CPU backend runs (wall time,
// the pool's threads included) and prints, when the context closes, the
// time per kind of op for each batch size seen: the CPU twin of
// ATS_GPU_PROFILE, for finding where a hybrid step's CPU segments go.
const EnvCPUProfile = "ATS_CPU_OPS_PROFILE"

// opProfile accumulates wall time per op name and batch size.
type opProfile struct {
	byTok map[int]*opRuns
}

type opRuns struct {
	total map[string]time.Duration
	calls map[string]int
	steps int
}

func newOpProfile() *opProfile {
	if os.Getenv(EnvCPUProfile) != "1" {
		return nil
	}
	return &opProfile{byTok: map[int]*opRuns{}}
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

func (p *opProfile) add(n int, name string, d time.Duration) {
	r := p.byTok[n]
	if r == nil {
		r = &opRuns{total: map[string]time.Duration{}, calls: map[string]int{}}
		p.byTok[n] = r
	}
	r.total[name] += d
	r.calls[name]++
}

// step counts a batch of n tokens.
func (p *opProfile) step(n int) {
	if r := p.byTok[n]; r != nil {
		r.steps++
	}
}

// Report prints the profile (nothing when it is off).
func (b *Backend) Report(w io.Writer) {
	p := b.prof
	if p == nil {
		return
	}
	var toks []int
	for n := range p.byTok {
		toks = append(toks, n)
	}
	sort.Ints(toks)
	for _, n := range toks {
		r := p.byTok[n]
		var names []string
		var sum time.Duration
		for name, d := range r.total {
			names = append(names, name)
			if !strings.Contains(name, partMark) {
				sum += d
			}
		}
		sort.Slice(names, func(i, j int) bool { return r.total[names[i]] > r.total[names[j]] })
		per := max(r.steps, 1)
		fmt.Fprintf(w, "CPU profile, batches of %d tokens: %d batches, %.3f ms of ops per batch\n", n, r.steps, ms(sum)/float64(per))
		for _, name := range names {
			d := r.total[name]
			fmt.Fprintf(w, "  %-28s %5d per batch %9.3f ms per batch %9.2f µs per call %5.1f%%\n",
				name, r.calls[name]/per, ms(d)/float64(per), ms(d)*1e3/float64(r.calls[name]), 100*float64(d)/float64(sum))
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

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
