package runtime

import (
	"context"
	"fmt"
	"os/exec"
	goruntime "runtime"
	"syscall"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/gpu"
)

// Stress is the competing load of the load experiments (`ats stress`,
// `ats bench --stress`, the oracle test under stress): busy threads on
// cpuPct percent of the cores, and the GPU's memory and link kept busy
// gpuPct percent of the time. It runs until ctx ends and reports what
// the GPU load moved over the link. Run it in a process of its own: it
// stands for another program.
func Stress(ctx context.Context, cpuPct, gpuPct int) (gpu.StressResult, error) {
	if cpuPct < 0 || cpuPct > 100 || gpuPct < 0 || gpuPct > 100 {
		return gpu.StressResult{}, fmt.Errorf("stress: cpu %d%%, gpu %d%%: want percents from 0 to 100", cpuPct, gpuPct)
	}
	if cpuPct > 0 {
		n := max(1, (goruntime.NumCPU()*cpuPct+50)/100)
		for i := 0; i < n; i++ {
			go func() {
				goruntime.LockOSThread()
				x := uint64(i)
				for ctx.Err() == nil {
					for k := 0; k < 1<<16; k++ {
						x = x*6364136223846793005 + 1442695040888963407
					}
				}
				_ = x
			}()
		}
	}
	if gpuPct > 0 {
		// A load of the GPU and the link, not of the CPU: the driver's
		// default for one context spins the host thread that waits for
		// the device, which would take a core from the measured
		// program's threads.
		if err := cudadrv.Init(); err == nil {
			if d, err := cudadrv.GetDevice(0); err == nil {
				_ = d.SetPrimaryContextFlags(cudadrv.CtxSchedBlockingSync)
			}
		}
		dev, err := gpu.Open()
		if err != nil {
			return gpu.StressResult{}, fmt.Errorf("stress: %w", err)
		}
		return dev.Stress(ctx, float64(gpuPct)/100)
	}
	<-ctx.Done()
	return gpu.StressResult{}, nil
}

// StartLoad starts c, a process that runs Stress (`ats stress`, or a test
// binary that does), waits for its load to take hold, and returns what
// ends it: SIGTERM, then a kill after grace. stop returns the process's
// failure, if it failed before it was told to end.
func StartLoad(c *exec.Cmd, grace time.Duration) (stop func() error, err error) {
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("starting the load %s: %w", c.Path, err)
	}
	time.Sleep(loadSettle)
	return func() error {
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			if err != nil && c.ProcessState.ExitCode() > 0 {
				return fmt.Errorf("the load %s: %w", c.Path, err)
			}
			return nil
		case <-time.After(grace):
			_ = c.Process.Kill()
			<-done
			return nil
		}
	}, nil
}

// loadSettle is how long a load is given to take hold before measuring.
const loadSettle = 500 * time.Millisecond
