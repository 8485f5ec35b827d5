//go:build !unix

package cuda

import "time"

// processCPUTime is not measured here (SplitStats.HostCPU stays 0).
func processCPUTime() time.Duration { return 0 }
