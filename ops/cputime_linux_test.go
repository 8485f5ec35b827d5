package ops

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPUTime is the CPU time the calling OS thread has used
// (CLOCK_THREAD_CPUTIME_ID): on a machine shared with other processes it
// measures a single-threaded kernel's own work, which wall time does not.
func threadCPUTime() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}

// processCPUTime is the CPU time all threads of the process have used
// (CLOCK_PROCESS_CPUTIME_ID): a multi-threaded kernel's work on a shared
// machine.
func processCPUTime() time.Duration {
	var ts syscall.Timespec
	const clockProcessCPUTime = 2
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockProcessCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
