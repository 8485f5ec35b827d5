package cuda

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// Measurements for the placement profile (runtime/profile.go).

// TimeRun runs seg like Run and returns the device time it took, from
// events around it: the kernels and transfers, not the host's launch or
// wait latency (the profile measures those as switch costs).
func (g *Exec) TimeRun(seg backend.Segment, rows int) (time.Duration, error) {
	if g.timing[0] == nil {
		for k := range g.timing {
			e, err := g.dev.ctx.NewEvent(cudadrv.EventDefault)
			if err != nil {
				return 0, fmt.Errorf("gpu: %w", err)
			}
			g.timing[k] = e
		}
	}
	if err := g.timing[0].Record(g.s); err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	if _, err := g.Run(seg, rows); err != nil {
		return 0, err
	}
	if err := g.timing[1].Record(g.s); err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	if err := g.Sync(); err != nil {
		return 0, err
	}
	return cudadrv.Elapsed(g.timing[0], g.timing[1])
}

// WriteBuffer fills the device rows of buffer id from v (profiling feeds
// realistic activations, so routing and softmax see real numbers).
func (g *Exec) WriteBuffer(id ir.BufID, v []float32) error {
	if g.bufs[id] == 0 || len(v) == 0 {
		return nil
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	if err := g.dev.ctx.CopyHtoD(g.bufs[id], b); err != nil {
		return fmt.Errorf("gpu: buffer %s: %w", g.prog.Bufs[id].Name, err)
	}
	return nil
}

// MeasureSwitch times moving n floats of activations from the device to
// mapped host memory and back the way the executor does (a copy kernel,
// then a wait for the stream), and returns the median seconds of one way.
func (d *Device) MeasureSwitch(n, reps int) (float64, error) {
	host, err := d.ctx.HostAlloc(4*n, cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
	if err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	defer host.Free()
	dev, err := d.ctx.Alloc(4 * n)
	if err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	defer d.ctx.Free(dev)
	s, err := d.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	defer s.Destroy()
	var ts []float64
	for r := 0; r < reps+1; r++ {
		start := time.Now()
		if err := errors.Join(d.elem.CopyF32(s, host.DevicePtr(), dev, n), s.Synchronize(),
			d.elem.CopyF32(s, dev, host.DevicePtr(), n), s.Synchronize()); err != nil {
			return 0, fmt.Errorf("gpu: %w", err)
		}
		if r > 0 { // the first warms up
			ts = append(ts, time.Since(start).Seconds()/2)
		}
	}
	sort.Float64s(ts)
	return ts[len(ts)/2], nil
}

// MeasureUpload times copying src (part of the mapped model file, pinned
// through reg when it could be) to the device on a stream of its own, as
// streamed weights travel, and returns bytes per second.
func (d *Device) MeasureUpload(src []byte, files [][]byte, reps int) (bytesPerSec float64, pinned bool, err error) {
	if len(src) == 0 {
		return 0, false, errors.New("gpu: nothing to upload")
	}
	reg, _ := registerFiles(d, files, false, backend.Options{})
	defer reg.release()
	dst, err := d.ctx.Alloc(len(src))
	if err != nil {
		return 0, false, fmt.Errorf("gpu: %w", err)
	}
	defer d.ctx.Free(dst)
	s, err := d.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return 0, false, fmt.Errorf("gpu: %w", err)
	}
	defer s.Destroy()
	var ev [2]*cudadrv.Event
	for k := range ev {
		if ev[k], err = d.ctx.NewEvent(cudadrv.EventDefault); err != nil {
			return 0, false, fmt.Errorf("gpu: %w", err)
		}
		defer ev[k].Destroy()
	}
	var ts []float64
	for r := 0; r < reps+1; r++ {
		if err := errors.Join(ev[0].Record(s), s.CopyHtoD(dst, src), ev[1].Record(s), s.Synchronize()); err != nil {
			return 0, false, fmt.Errorf("gpu: %w", err)
		}
		t, err := cudadrv.Elapsed(ev[0], ev[1])
		if err != nil {
			return 0, false, err
		}
		if r > 0 {
			ts = append(ts, t.Seconds())
		}
	}
	sort.Float64s(ts)
	return float64(len(src)) / ts[len(ts)/2], reg.Pinned, nil
}

// Stress loads the device until ctx ends, busy for the fraction duty of
// each 20 ms: copy kernels over 1 GiB of device memory (the memory
// bandwidth a decode step lives on) and, on a stream of their own, 256 MiB
// copies from pinned host memory over the link. It is the competing load
// of `ats bench --stress gpu=N`. It reports what went over the link, so
// that an experiment can add that to what other readers of host memory got.
func (d *Device) Stress(ctx context.Context, duty float64) (StressResult, error) {
	const devBytes, hostBytes = 1 << 30, 256 << 20
	a, err := d.ctx.Alloc(devBytes)
	if err != nil {
		return StressResult{}, fmt.Errorf("gpu stress: %w", err)
	}
	defer d.ctx.Free(a)
	b, err := d.ctx.Alloc(devBytes)
	if err != nil {
		return StressResult{}, fmt.Errorf("gpu stress: %w", err)
	}
	defer d.ctx.Free(b)
	host, err := d.ctx.HostAlloc(hostBytes, cudadrv.HostAllocPortable)
	if err != nil {
		return StressResult{}, fmt.Errorf("gpu stress: %w", err)
	}
	defer host.Free()
	ks, err := d.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return StressResult{}, fmt.Errorf("gpu stress: %w", err)
	}
	defer ks.Destroy()
	cs, err := d.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		return StressResult{}, fmt.Errorf("gpu stress: %w", err)
	}
	defer cs.Destroy()
	var res StressResult
	t0 := time.Now()
	period := 20 * time.Millisecond
	busy := time.Duration(float64(period) * min(max(duty, 0), 1))
	for ctx.Err() == nil {
		start := time.Now()
		for time.Since(start) < busy {
			if err := errors.Join(d.elem.CopyF32(ks, b, a, devBytes/4), cs.CopyHtoD(a, host.Bytes()), ks.Synchronize(), cs.Synchronize()); err != nil {
				return StressResult{}, fmt.Errorf("gpu stress: %w", err)
			}
			res.LinkBytes += hostBytes
		}
		if rest := period - time.Since(start); rest > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(rest):
			}
		}
	}
	res.Elapsed = time.Since(t0)
	return res, nil
}

// StressResult is what a Stress run moved over the link.
type StressResult struct {
	LinkBytes int64         // host to device, from pinned memory
	Elapsed   time.Duration // the whole run, idle parts included
}

// LinkGBps is the link's average rate over the run.
func (r StressResult) LinkGBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.LinkBytes) / r.Elapsed.Seconds() / 1e9
}
