// Package stress is the competing load of the load experiments: busy
// CPU threads and a GPU whose memory and link are kept busy, run in a
// process of its own as another program would.
package stress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	goruntime "runtime"
	"strings"
	"syscall"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/backend/cuda"
)

// Stress is the competing load of the load experiments (`ats stress`,
// `ats bench --stress`, the oracle test under stress): busy threads on
// cpuPct percent of the cores, and the GPU's memory and link kept busy
// gpuPct percent of the time. It runs until ctx ends and reports what
// the GPU load moved over the link. Run it in a process of its own: it
// stands for another program. Once the load runs it writes LoadReady on
// a line of ready (nil: nowhere), which StartLoad waits for: the caller
// must handle the signal that ends it (SIGTERM) by then.
func Stress(ctx context.Context, cpuPct, gpuPct int, ready io.Writer) (cuda.StressResult, error) {
	if cpuPct < 0 || cpuPct > 100 || gpuPct < 0 || gpuPct > 100 {
		return cuda.StressResult{}, fmt.Errorf("stress: cpu %d%%, gpu %d%%: want percents from 0 to 100", cpuPct, gpuPct)
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
		dev, err := cuda.Open(0)
		if err != nil {
			return cuda.StressResult{}, fmt.Errorf("stress: %w", err)
		}
		announce(ready) // the device is open: its load starts at once
		return dev.Stress(ctx, float64(gpuPct)/100)
	}
	announce(ready)
	<-ctx.Done()
	return cuda.StressResult{}, nil
}

// LoadReady is the line a load process (Stress) writes on its standard
// output once it runs.
const LoadReady = "ats: load running"

func announce(w io.Writer) {
	if w != nil {
		fmt.Fprintln(w, LoadReady)
	}
}

// StartLoad starts c, a process that runs Stress (`ats stress`, or a test
// binary that does) with its standard output to LoadReady's pipe, waits
// until the load says it runs (loadStart at most: a process told to end
// before it handles the signal would die of it) and has taken hold, and
// returns what ends it: SIGTERM, then a kill after grace. stop returns the
// process's failure, if it failed before it was told to end.
func StartLoad(c *exec.Cmd, grace time.Duration) (stop func() error, err error) {
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("the load %s: %w", c.Path, err)
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("starting the load %s: %w", c.Path, err)
	}
	ready := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		line, err := r.ReadString('\n')
		if err == nil && strings.TrimSpace(line) != LoadReady {
			err = fmt.Errorf("it wrote %q, not that it runs", strings.TrimSpace(line))
		}
		ready <- err
		_, _ = io.Copy(io.Discard, r) // until it exits (Wait closes the pipe)
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
			return nil, fmt.Errorf("the load %s did not start: %w", c.Path, err)
		}
	case <-time.After(loadStart):
		_ = c.Process.Kill()
		_ = c.Wait()
		return nil, fmt.Errorf("the load %s did not say it runs within %v", c.Path, loadStart)
	}
	time.Sleep(loadSettle)
	return func() error {
		_ = c.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-time.After(grace):
			_ = c.Process.Kill()
			<-done
			return nil
		}
		if err != nil && c.ProcessState.ExitCode() > 0 {
			return fmt.Errorf("the load %s: %w", c.Path, err)
		}
		return nil
	}, nil
}

// loadStart bounds how long a load process may take to start running.
const loadStart = 30 * time.Second

// loadSettle is how long a load is given to take hold before measuring.
const loadSettle = 500 * time.Millisecond
