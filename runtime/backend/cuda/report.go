package cuda

import (
	"fmt"
	"io"
	"strings"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
)

// Report writes whether ats can use a GPU here (and why not), each CUDA
// device's name, compute capability, memory and multiprocessors, the kernel
// images ats loads on it (SASS, or PTX the driver JIT-compiles), and NVML's
// live figures where NVML is installed. It only queries: no context is
// created, no memory allocated.
func Report(w io.Writer) error {
	ok, reason := cudadrv.Available()
	if !ok {
		fmt.Fprintf(w, "CUDA: not available: %s\nats runs on the CPU.\n", reason)
	} else {
		v, _ := cudadrv.DriverVersion()
		n, _ := cudadrv.DeviceCount()
		fmt.Fprintf(w, "CUDA: available, driver API %d.%d (%s), %d device(s)\n", v/1000, v%1000/10, cudadrv.LibraryPath(), n)
	}

	mon, nvmlReason := cudadrv.OpenMonitor()
	defer mon.Close()
	if mon != nil {
		ver, err := mon.DriverVersion()
		if err != nil {
			ver = err.Error()
		}
		fmt.Fprintf(w, "NVML: driver %s\n", ver)
	} else {
		fmt.Fprintf(w, "NVML: not available: %s\n", nvmlReason)
	}
	if !ok {
		return nil
	}

	n, _ := cudadrv.DeviceCount()
	for i := range n {
		d, err := cudadrv.GetDevice(i)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		fmt.Fprintf(w, "\ndevice %d: %s\n", i, info.Name)
		fmt.Fprintf(w, "  compute capability %d.%d, kernels %s\n", info.Major, info.Minor, kernelImages(info.CC()))
		fmt.Fprintf(w, "  memory %s, %d SMs, L2 %s, shared memory per block %s (opt-in %s)\n",
			gib(info.TotalMem), info.Multiprocessors, mib(uint64(info.L2CacheBytes)),
			kib(info.MaxSharedPerBlock), kib(info.MaxSharedPerBlockOptin))
		fmt.Fprintf(w, "  PCI %s, %d copy engine(s), map host memory %s, read-only host registration %s\n",
			info.PCIBusID, info.AsyncEngines, yes(info.CanMapHostMemory), yes(info.ReadOnlyHostRegisterSupport))
		if mon == nil {
			continue
		}
		g, err := mon.DeviceByPCIBusID(info.PCIBusID)
		if err != nil {
			fmt.Fprintf(w, "  NVML: %v\n", err)
			continue
		}
		s, err := g.Sample()
		fmt.Fprintf(w, "  NVML: utilisation %d%% (memory %d%%), memory used %s, free %s\n",
			s.GPUUtil, s.MemUtil, gib(s.MemUsed), gib(s.MemFree))
		fmt.Fprintf(w, "        PCIe gen %d x%d, TX %.1f MB/s, RX %.1f MB/s; SM clock %d MHz (max %d), memory clock %d MHz; %d °C, %.0f W\n",
			s.PCIeGen, s.PCIeWidth, float64(s.PCIeTX)/1e6, float64(s.PCIeRX)/1e6,
			s.SMClockMHz, s.MaxSMClockMHz, s.MemClockMHz, s.TempC, s.PowerW)
		if err != nil {
			fmt.Fprintf(w, "        (not reported: %v)\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	}
	return nil
}

// kernelImages says which image of each embedded module loads on a device
// of capability cc, collapsed when they all agree.
func kernelImages(cc int) string {
	byArch := map[string][]string{}
	var order []string
	for _, m := range kernels.Modules() {
		v := "none"
		if img, err := kernels.Select(m, cc); err == nil {
			v = img.String()
		} else {
			v = "none (" + err.Error() + ")"
		}
		if _, seen := byArch[v]; !seen {
			order = append(order, v)
		}
		byArch[v] = append(byArch[v], m)
	}
	var parts []string
	for _, v := range order {
		parts = append(parts, fmt.Sprintf("%s for %s", v, strings.Join(byArch[v], ", ")))
	}
	if len(parts) == 0 {
		return "none embedded"
	}
	return strings.Join(parts, "; ")
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
func kib(b int) string    { return fmt.Sprintf("%d KiB", b>>10) }

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
