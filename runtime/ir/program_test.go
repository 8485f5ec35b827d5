package ir

import "testing"

func TestOpIndex(t *testing.T) {
	p := &Program{Ops: make([]Op, 3)}
	for i := range p.Ops {
		if got := p.OpIndex(&p.Ops[i]); got != i {
			t.Errorf("OpIndex of op %d: %d", i, got)
		}
	}
	if got := p.OpIndex(&Op{}); got != -1 {
		t.Errorf("OpIndex of another program's op: %d, want -1", got)
	}
}
