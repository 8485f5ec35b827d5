//go:build !linux

package ops

import "time"

// threadCPUTime is not measured here (see cputime_linux_test.go).
func threadCPUTime() time.Duration { return 0 }

func processCPUTime() time.Duration { return 0 }
