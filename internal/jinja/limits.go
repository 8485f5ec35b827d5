package jinja

// ats: this file is not part of upstream. It bounds one rendering, so a
// hostile template (from a model file) cannot take the process down: see
// README.md.

import (
	"context"
	"fmt"
	"time"
)

// Limits bound one rendering (RenderLimited). A zero field means no limit
// of that kind.
type Limits struct {
	// Timeout is the wall-clock budget; Context, when set, also stops the
	// rendering when it is cancelled.
	Timeout time.Duration
	Context context.Context
	// MaxOutput bounds the rendered text, and also any one string or list
	// the template builds on the way (a list counts ValueBytes an item),
	// so a value can never outgrow what may be printed.
	MaxOutput int
	// MaxAlloc bounds the bytes that template operations allocate in all
	// (strings, lists and dicts they build, output included). Garbage
	// counts too, so the limit is also a bound on the memory a rendering
	// can hold at once.
	MaxAlloc int64
	// MaxDepth bounds nested macro and caller() calls: recursion.
	MaxDepth int
	// MaxSteps bounds the work: loop iterations, tags and expressions
	// evaluated, and items visited by filters.
	MaxSteps int64
}

// ValueBytes is what a list item or dict entry counts against
// Limits.MaxAlloc and Limits.MaxOutput: the size of a Value.
const ValueBytes = 32

// maxNesting bounds how deeply expressions, blocks and values may nest, in
// the parser and when a value is printed, compared or encoded (a list may
// contain itself). Go grows goroutine stacks up to a fatal limit, so deep
// recursion must fail before it gets there.
const maxNesting = 1000

// LimitError reports the limit a rendering broke. Find it with errors.As.
type LimitError struct {
	// Limit names the limit: "time", "output size", "memory", "recursion
	// depth", "steps" or "nesting".
	Limit string
	// Max is the limit's value (nanoseconds for "time").
	Max int64
	// What says what broke it, when known.
	What string
}

func (e *LimitError) Error() string {
	max := fmt.Sprint(e.Max)
	switch e.Limit {
	case "time":
		max = time.Duration(e.Max).String()
	case "output size", "memory":
		max += " bytes"
	case "recursion depth":
		max += " nested calls"
	case "nesting":
		max += " levels"
	}
	msg := fmt.Sprintf("template exceeded its %s limit (%s)", e.Limit, max)
	if e.What != "" {
		msg += ": " + e.What
	}
	return msg
}

// Budget is what is left of a rendering's limits. Callables made with
// NewLimitedCallable receive it, so work they do on the template's behalf
// counts too. A nil *Budget has no limits.
type Budget struct {
	lim      Limits
	deadline time.Time
	steps    int64
	alloc    int64
	depth    int // nested macro and caller calls
	nest     int // nested evaluation
	check    int64
	// err is the first limit broken. It sticks: engine code that ignores
	// an error (some filters do) cannot make the rendering go on.
	err error
}

func newBudget(lim Limits) *Budget {
	b := &Budget{lim: lim}
	if lim.Timeout > 0 {
		b.deadline = time.Now().Add(lim.Timeout)
	}
	return b
}

// checkEvery is how many steps pass between looks at the clock and the
// context: time.Now costs tens of nanoseconds, a step a few.
const checkEvery = 256

func (b *Budget) fail(err error) error {
	if b == nil {
		return err
	}
	if b.err == nil {
		b.err = err
	}
	return b.err
}

// Step counts n units of work.
func (b *Budget) Step(n int64) error {
	if b == nil {
		return nil
	}
	if b.err != nil {
		return b.err
	}
	b.steps += n
	if b.lim.MaxSteps > 0 && b.steps > b.lim.MaxSteps {
		return b.fail(&LimitError{Limit: "steps", Max: b.lim.MaxSteps, What: "too many loop iterations or evaluations"})
	}
	b.check += n
	if b.check >= checkEvery {
		b.check = 0
		return b.poll()
	}
	return nil
}

// poll looks at the clock and the context.
func (b *Budget) poll() error {
	if !b.deadline.IsZero() && time.Now().After(b.deadline) {
		return b.fail(&LimitError{Limit: "time", Max: int64(b.lim.Timeout)})
	}
	if b.lim.Context != nil {
		if err := b.lim.Context.Err(); err != nil {
			return b.fail(fmt.Errorf("template rendering stopped: %w", err))
		}
	}
	return nil
}

// Alloc accounts for a value of n bytes about to be built: it fails when
// the value would be larger than the output may be, or when the
// rendering's allocations would pass MaxAlloc. what names the value for the
// error.
func (b *Budget) Alloc(n int64, what string) error { return b.Grow(0, n, what) }

// Grow accounts for n more bytes added to a value that has already: the
// value may not outgrow the output limit.
func (b *Budget) Grow(have, n int64, what string) error {
	if b == nil {
		return nil
	}
	if b.err != nil {
		return b.err
	}
	if n < 0 || have+n < 0 {
		// An overflowed size computation: certainly too large.
		n = 1 << 62
	}
	if b.lim.MaxOutput > 0 && have+n > int64(b.lim.MaxOutput) {
		return b.fail(&LimitError{Limit: "output size", Max: int64(b.lim.MaxOutput), What: fmt.Sprintf("%s of %d bytes", what, satAdd(have, n))})
	}
	b.alloc += n
	if b.lim.MaxAlloc > 0 && b.alloc > b.lim.MaxAlloc {
		return b.fail(&LimitError{Limit: "memory", Max: b.lim.MaxAlloc, What: fmt.Sprintf("%s of %d bytes", what, n)})
	}
	// Large values take time to build: count them as work too.
	return b.Step(1 + n/4096)
}

// enterCall counts a macro or caller call; leaveCall undoes it.
func (b *Budget) enterCall(name string) error {
	if b == nil {
		return nil
	}
	if b.err != nil {
		return b.err
	}
	b.depth++
	if b.lim.MaxDepth > 0 && b.depth > b.lim.MaxDepth {
		return b.fail(&LimitError{Limit: "recursion depth", Max: int64(b.lim.MaxDepth), What: fmt.Sprintf("calling %s", name)})
	}
	return nil
}

func (b *Budget) leaveCall() {
	if b != nil {
		b.depth--
	}
}

// enter counts one level of nested evaluation; leave undoes it.
func (b *Budget) enter() error {
	if b == nil {
		return nil
	}
	b.nest++
	if b.nest > maxNesting {
		return b.fail(&LimitError{Limit: "nesting", Max: maxNesting, What: "expressions or values nested too deeply (a list or dict that contains itself?)"})
	}
	return nil
}

func (b *Budget) leave() {
	if b != nil {
		b.nest--
	}
}

// Err returns the first limit broken, or nil.
func (b *Budget) Err() error {
	if b == nil {
		return nil
	}
	return b.err
}

// NewLimitedCallable is NewCallable for a function whose work depends on
// its arguments (it may build large values): it receives the rendering's
// budget, nil when the rendering has no limits.
func NewLimitedCallable(name string, fn func(b *Budget, args []Value, kwargs map[string]Value) (Value, error)) Value {
	return Value{kind: KindCallable, v: Callable{Name: name, Fn: func(args []Value, kwargs map[string]Value) (Value, error) {
		return fn(nil, args, kwargs)
	}, limited: fn}}
}

// call invokes c with the budget b.
func (c *Callable) call(b *Budget, args []Value, kwargs map[string]Value) (Value, error) {
	if err := b.Step(1); err != nil {
		return Undefined(), err
	}
	if c.limited != nil {
		return c.limited(b, args, kwargs)
	}
	return c.Fn(args, kwargs)
}

// RenderLimited is RenderValues within the limits lim. Breaking one
// returns a *LimitError.
func (t *Template) RenderLimited(data map[string]Value, lim Limits) (string, error) {
	return renderBudget(t.nodes, data, newBudget(lim))
}

// satAdd adds sizes without overflowing.
func satAdd(a, b int64) int64 {
	if a+b < a {
		return 1<<63 - 1
	}
	return a + b
}

// satMul multiplies sizes (non-negative) without overflowing.
func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

// Kind returns v's kind (ats: lets callers name a value's type in an error
// without printing a value that may be huge).
func (v Value) Kind() Kind { return v.kind }

func (k Kind) String() string {
	switch k {
	case KindUndefined:
		return "undefined"
	case KindNone:
		return "none"
	case KindBool:
		return "a boolean"
	case KindInt:
		return "an integer"
	case KindFloat:
		return "a float"
	case KindString:
		return "a string"
	case KindList:
		return "a list"
	case KindDict:
		return "a dict"
	case KindCallable:
		return "a callable"
	}
	return fmt.Sprintf("kind %d", int(k))
}
