//go:build unix

package cuda

import (
	"syscall"
	"time"
)

// processCPUTime is the CPU time the whole process has used, user and
// system (0 when the system does not say): over a stretch of wall time it
// tells how many threads were busy.
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
