package main

import "fmt"

// exitStatus is an error that ends ats with a particular status and no
// message of its own: 130 after Ctrl-C (128 + SIGINT), as shells expect
// of a program that the interrupt stopped.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// interrupted is the status of a command stopped by Ctrl-C.
const interrupted = exitStatus(130)

// checkRepeatWindow rejects a penalty window longer than the context: the
// sequence can never hold more tokens, and -1 already means all of them.
func checkRepeatWindow(n, ctxSize int) error {
	if n > ctxSize {
		return fmt.Errorf("repeat_last_n %d is more than the context of %d tokens; use at most %d, or -1 for all of them", n, ctxSize, ctxSize)
	}
	return nil
}
