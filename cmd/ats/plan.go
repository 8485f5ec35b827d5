package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/placement"
	"github.com/atsinfer/ats/runtime/session"
)

func init() {
	register(func() *cobra.Command {
		var (
			modelPath, svg string
			asJSON, fresh  bool
			ctxSize, thrds int
			batch          int
			pf             placementFlags
			card           cardPlanOptions
		)
		cmd := &cobra.Command{
			Use:   "plan -m MODEL [--vram-budget SIZE] [--json] [--svg FILE]",
			Short: "Show which tensors ats keeps on the GPU and which on the CPU",
			Long: `plan places the model's units (each weight tensor with the op that reads
it, and each layer's attention with its KV cache) under the VRAM budget the
way a context would: everything on the GPU when the model fits, else the
dynamic program over the model's measured profile (ats profile), ranking
units by performance density (decode time saved on the GPU per byte of
VRAM) and charging every CPU/GPU switch. It prints what goes where, layer
by layer, with densities and the predicted prefill and decode speed.
--json writes the placement for machines (and for --placement of the run
commands, after editing it); --svg draws the placement map and the density
ranking with the budget line.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return fmt.Errorf("plan: -m MODEL is required")
				}
				stderr := cmd.ErrOrStderr()
				if card.wanted() {
					m, err := model.Open(modelPath)
					if err != nil {
						return err
					}
					defer m.Close()
					kt, _, err := pf.kvType()
					if err != nil {
						return fmt.Errorf("plan: %w", err)
					}
					return printCardPlan(cmd.OutOrStdout(), m, card, ctxSize, kt, batch)
				}
				opt := session.Options{CtxSize: ctxSize, Threads: thrds, Batch: batch}
				if err := pf.apply(&opt, stderr); err != nil {
					return fmt.Errorf("plan: %w", err)
				}
				if opt.Device == nil && opt.Backend != executor.BackendCPU {
					return fmt.Errorf("plan: no GPU to plan for here (ats gpu says why); --gpu NAME plans for a card by an estimate, e.g. --gpu \"RTX 3060 Laptop\"")
				}
				m, err := model.Open(modelPath)
				if err != nil {
					return err
				}
				defer m.Close()
				pln, po, err := session.NewPlanner(m, opt)
				if err != nil {
					return fmt.Errorf("plan: %w", err)
				}
				pl, prof, err := pln.Plan(po, fresh)
				if err != nil {
					return fmt.Errorf("plan: %w", err)
				}
				if svg != "" {
					if err := os.WriteFile(svg, []byte(placementSVG(pl)), 0o644); err != nil {
						return fmt.Errorf("plan: %w", err)
					}
				}
				if asJSON {
					b, err := pl.JSON()
					if err != nil {
						return err
					}
					_, err = cmd.OutOrStdout().Write(append(b, '\n'))
					return err
				}
				printPlacement(cmd.OutOrStdout(), pl, prof, m)
				if svg != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "\nwrote %s\n", svg)
				}
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.BoolVar(&asJSON, "json", false, "print the placement as JSON")
		f.StringVar(&svg, "svg", "", "draw the placement map and density ranking into this SVG file")
		f.BoolVar(&fresh, "fresh", false, "measure the profile again even when one is cached")
		f.IntVarP(&ctxSize, "ctx-size", "c", 0, "context size in tokens (0: the model's, at most 4096): sizes the KV caches")
		f.IntVarP(&thrds, "threads", "t", 0, "CPU threads (0: all cores)")
		f.IntVarP(&batch, "batch-size", "b", 512, "most prompt tokens computed together (sizes the GPU's activation buffers)")
		pf.register(f)
		f.StringVar(&card.gpu, "gpu", "", "plan for this card instead of the GPU here, by a roofline estimate from its published figures (RTX 3060 Laptop, RTX 4090, H100 SXM, ...)")
		f.StringVar(&card.vram, "gpu-vram", "", "with --gpu: its memory instead of the table's (or, with --gpu-bandwidth, a card of its own)")
		f.Float64Var(&card.bandwidth, "gpu-bandwidth", 0, "with --gpu: its memory bandwidth in GB/s instead of the table's")
		f.Float64Var(&card.link, "link-gbps", 0, "with --gpu: the host link in GB/s instead of the table's")
		f.Float64Var(&card.cpuGBps, "cpu-gbps", 0, "with --gpu: the CPU's memory bandwidth in GB/s (default 40, a laptop's dual-channel DDR4)")
		f.IntVar(&card.cpuCores, "cpu-cores", 0, "with --gpu: the CPU's cores (default 8)")
		return cmd
	})
	register(func() *cobra.Command {
		var (
			modelPath              string
			fresh, asJSON, cpuOnly bool
			thrds                  int
		)
		cmd := &cobra.Command{
			Use:   "profile -m MODEL [--fresh] [--json]",
			Short: "Measure every unit of a model on the CPU and the GPU",
			Long: `profile measures the time of each unit of the model (a weight tensor with
the op that reads it; units of the same shape and type share a
measurement) on the CPU and on the GPU, at decode (1 token) and at prefill
batches of 32, 128 and 512 tokens, the cost of switching between the two,
and the speed of streaming weights to the GPU. The profile is cached under
the user's cache directory, keyed by the model file and this machine, and
reused by planning; --fresh measures again. --cpu-only measures the CPU's
side alone (no GPU needed; not cached, since no placement can be planned
from it).`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if modelPath == "" {
					return fmt.Errorf("profile: -m MODEL is required")
				}
				m, err := model.Open(modelPath)
				if err != nil {
					return err
				}
				defer m.Close()
				opt := session.Options{Threads: thrds, Progress: profileProgress(cmd.ErrOrStderr())}
				envOptions(&opt)
				opt.Notes = notes(cmd.ErrOrStderr())
				for _, n := range envIgnored() {
					opt.Notes.Note(n)
				}
				if !cpuOnly {
					if opt.Device, err = openDevice(executor.BackendGPU, opt.Notes); err != nil {
						return fmt.Errorf("profile: %w", err)
					}
				}
				pln, po, err := session.NewPlanner(m, opt)
				if err != nil {
					return fmt.Errorf("profile: %w", err)
				}
				var prof *plan.Profile
				if cpuOnly {
					po.Progress = progressSaying(cmd.ErrOrStderr(), "ats: measuring this model's units on the CPU (not cached)")
					prof, err = pln.ProfileHost(po)
				} else {
					prof, err = pln.Profile(po, fresh)
				}
				if err != nil {
					return fmt.Errorf("profile: %w", err)
				}
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", " ")
					return enc.Encode(prof)
				}
				printProfile(cmd.OutOrStdout(), prof)
				return nil
			},
		}
		f := cmd.Flags()
		f.StringVarP(&modelPath, "model", "m", "", "GGUF model file")
		f.BoolVar(&fresh, "fresh", false, "measure again even when a profile is cached")
		f.BoolVar(&asJSON, "json", false, "print the profile as JSON")
		f.BoolVar(&cpuOnly, "cpu-only", false, "measure the CPU's side only (no GPU needed; not cached)")
		f.IntVarP(&thrds, "threads", "t", 0, "CPU threads (0: all cores)")
		var budget string
		f.StringVar(&budget, "vram-budget", "", "accepted for symmetry with the run commands (a profile does not depend on it)")
		return cmd
	})
}

// usPerMiB writes a density (seconds saved per byte) as µs saved per MiB.
func usPerMiB(d float64) float64 { return d * (1 << 20) * 1e6 }

// printPlacement writes the placement for people: totals, the prediction,
// then a table of layers × roles.
func printPlacement(w io.Writer, pl *placement.Placement, prof *plan.Profile, m *model.Model) {
	fmt.Fprintf(w, "model: %s (%s, %d layers), %s of weights\n", filepath.Base(pl.Model), pl.Arch, pl.Layers, executor.FormatBytes(m.WeightBytes()))
	fmt.Fprintf(w, "budget: %s; fixed %s (activations, scratch, staging ring, norms)", executor.FormatBytes(pl.Budget), executor.FormatBytes(pl.FixedBytes))
	if pl.ContextBytes > 0 {
		fmt.Fprintf(w, "; in use before ats (CUDA context, other processes, not counted): %s", executor.FormatBytes(pl.ContextBytes))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "placement: %s\n", pl.Describe())
	if pl.Depth > 0 {
		fmt.Fprintf(w, "planned for a context of %d positions (half the cache: attention's times at that depth)\n", pl.Depth)
	}
	if pl.RepackedBytes > 0 {
		fmt.Fprintf(w, "repacked for the CPU: %s of its weights (timed so; the rest runs from the file's blocks)\n", executor.FormatBytes(pl.RepackedBytes))
	}
	var kept int
	var keptBytes int64
	for _, u := range pl.Units {
		if u.KeptInRing {
			kept, keptBytes = kept+1, keptBytes+u.Bytes
		}
	}
	if kept > 0 {
		fmt.Fprintf(w, "dynamic promotion: staging ring %s; on an idle machine it should keep %d CPU units (%s) there (CPU* below)\n",
			executor.FormatBytes(pl.RingBytes), kept, executor.FormatBytes(keptBytes))
	}
	if pl.Note != "" {
		fmt.Fprintf(w, "note: %s\n", pl.Note)
	}
	if p := pl.Predicted; p != nil {
		fmt.Fprintf(w, "predicted: decode %.1f t/s (%.1f ms a token)", p.DecodeTokensPerS, 1e3*p.DecodeStepSeconds)
		if p.PrefillBatch > 0 {
			fmt.Fprintf(w, "; prefill %.0f t/s in batches of %d", p.PrefillTokensPerS, p.PrefillBatch)
		}
		fmt.Fprintln(w)
	}
	for _, s := range pl.Prefill {
		fmt.Fprintf(w, "prefill batches of %d+ tokens stream %d CPU units to the GPU", s.MinBatch, len(s.Stream))
		if len(s.Split) > 0 {
			var ks []int
			for _, k := range s.Split {
				ks = append(ks, k)
			}
			slices.Sort(ks)
			share := fmt.Sprintf("0-%d", ks[0]-1)
			if ks[0] != ks[len(ks)-1] {
				share += fmt.Sprintf(" to 0-%d", ks[len(ks)-1]-1)
			}
			fmt.Fprintf(w, ", %d MoE layers split with the CPU (it computes experts %s of each)", len(s.Split), share)
		}
		fmt.Fprintln(w)
	}
	if len(pl.Routed) > 0 {
		paced := ", to start with: each step size's share then moves to where the two finish a layer together"
		if pl.RoutedFixed {
			paced = ""
		}
		fmt.Fprintf(w, "decode steps route %d CPU MoE layers: the GPU takes %.0f%% of the experts a step's tokens choose (up to %d a layer)%s, their weights copied over the link while the CPU computes the rest (ATS_MOE_ROUTED=0: never)\n",
			len(pl.Routed), 100*pl.RoutedShare, pl.RoutedExperts, paced)
	}
	if prof != nil {
		fmt.Fprintf(w, "profile: %s, %d threads, %s; measured %s\n", prof.Hardware.CPU, prof.Hardware.Threads, prof.Hardware.GPU, prof.Created.Format("2006-01-02 15:04"))
	}
	roles, byLayer, other := placementGrid(pl)
	fmt.Fprintf(w, "\n%5s", "layer")
	for _, r := range roles {
		fmt.Fprintf(w, "  %-13s", r)
	}
	fmt.Fprintln(w)
	for l := 0; l < pl.Layers; l++ {
		fmt.Fprintf(w, "%5d", l)
		for _, r := range roles {
			u, ok := byLayer[l][r]
			if !ok {
				fmt.Fprintf(w, "  %-13s", "")
				continue
			}
			fmt.Fprintf(w, "  %-13s", cell(u))
		}
		fmt.Fprintln(w)
	}
	for _, u := range other {
		fmt.Fprintf(w, "%s: %s\n", u.Name, cell(u))
	}
	fmt.Fprintf(w, "\n(GPU/CPU: where the unit lives; the number: decode time it saves on the GPU per MiB of VRAM, in µs/MiB)\n")
}

func cell(u placement.UnitPlacement) string {
	b := strings.ToUpper(u.Backend)
	if u.KeptInRing {
		b += "*"
	}
	if u.Density == 0 {
		return b
	}
	return fmt.Sprintf("%s %6.2f", b, usPerMiB(u.Density))
}

// placementGrid arranges the units by layer and role (roles in order of
// first appearance); units outside the layers come apart.
func placementGrid(pl *placement.Placement) (roles []string, byLayer []map[string]placement.UnitPlacement, other []placement.UnitPlacement) {
	byLayer = make([]map[string]placement.UnitPlacement, pl.Layers)
	seen := map[string]bool{}
	for _, u := range pl.Units {
		if u.Layer < 0 || u.Layer >= pl.Layers {
			other = append(other, u)
			continue
		}
		if byLayer[u.Layer] == nil {
			byLayer[u.Layer] = map[string]placement.UnitPlacement{}
		}
		byLayer[u.Layer][u.Role] = u
		if !seen[u.Role] {
			seen[u.Role] = true
			roles = append(roles, u.Role)
		}
	}
	return roles, byLayer, other
}

// printProfile writes a profile: one line per measured unit shape.
func printProfile(w io.Writer, p *plan.Profile) {
	gpuName := fmt.Sprintf("%s (driver %s)", p.Hardware.GPU, p.Hardware.Driver)
	if p.Hardware.GPU == "" {
		gpuName = "no GPU (the CPU's side only)"
	}
	fmt.Fprintf(w, "profile of %s on %s (%d cores, %d threads) and %s, measured %s in %.1fs\n",
		p.Model, p.Hardware.CPU, p.Hardware.Cores, p.Hardware.Threads, gpuName, p.Created.Format("2006-01-02 15:04"), p.Took)
	fmt.Fprintf(w, "%d units, %d distinct shapes measured; decode attention at position %d; cpu: from the file's blocks (from repacked copies)\n\n", len(p.Units), p.Measured, p.DecodePos)
	fmt.Fprintf(w, "%-34s", "unit (first of its shape)")
	for _, b := range p.Batches {
		head := fmt.Sprintf("batch %d cpu (repacked) / gpu µs", b)
		if p.Hardware.GPU == "" {
			head = fmt.Sprintf("batch %d cpu (repacked) µs", b)
		}
		fmt.Fprintf(w, " %30s", head)
	}
	fmt.Fprintf(w, "  %s\n", "same shape")
	count := map[string]int{}
	for _, u := range p.Units {
		count[u.Sig]++
	}
	shown := map[string]bool{}
	for _, u := range p.Units {
		if shown[u.Sig] {
			continue
		}
		shown[u.Sig] = true
		fmt.Fprintf(w, "%-34s", u.Name)
		for i := range p.Batches {
			cpu := fmt.Sprintf("%.1f", 1e6*u.CPU[i])
			if i < len(u.CPUPacked) {
				cpu += fmt.Sprintf(" (%.1f)", 1e6*u.CPUPacked[i])
			}
			if p.Hardware.GPU != "" {
				cpu = fmt.Sprintf("%s / %.1f", cpu, 1e6*u.GPU[i])
			}
			fmt.Fprintf(w, " %30s", cpu)
		}
		fmt.Fprintf(w, "  ×%d\n", count[u.Sig])
	}
	if p.DepthPos > 0 {
		fmt.Fprintf(w, "\nper position of context, each row (timed %d positions further in):\n", p.DepthPos)
		shown := map[string]bool{}
		for _, u := range p.Units {
			if len(u.CPUPerPos) == 0 || shown[u.Sig] {
				continue
			}
			shown[u.Sig] = true
			fmt.Fprintf(w, "%-34s", u.Name)
			for i := range p.Batches {
				gpu := 0.0
				if i < len(u.GPUPerPos) {
					gpu = u.GPUPerPos[i]
				}
				cell := fmt.Sprintf("%.2f ns", 1e9*u.CPUPerPos[i])
				if p.Hardware.GPU != "" {
					cell = fmt.Sprintf("%.2f / %.3f ns", 1e9*u.CPUPerPos[i], 1e9*gpu)
				}
				fmt.Fprintf(w, " %30s", cell)
			}
			fmt.Fprintln(w)
		}
	}
	if p.HostRead > 0 {
		fmt.Fprintf(w, "\nhost memory read by the CPU's threads: %.1f GB/s (no unit's decode on the CPU is counted faster)\n", p.HostRead/1e9)
	}
	if len(p.Switch) == 0 {
		return // no GPU
	}
	fmt.Fprintf(w, "\nswitch (activations of one hidden row per token, one way):\n")
	for i, b := range p.Batches {
		fmt.Fprintf(w, "  batch %4d: %.1f µs + %.1f GB/s\n", b, 1e6*p.Switch[i].Latency, p.Switch[i].BytesPerSec/1e9)
	}
	pinned := "pinned (the mapped file registered with the driver)"
	if !p.Pinned {
		pinned = "pageable (the driver could not register the file)"
	}
	fmt.Fprintf(w, "streaming weights to the GPU: %.1f GB/s, %s\n", p.Stream.BytesPerSec/1e9, pinned)
}

// placementSVG draws the placement map (layers × roles, coloured by
// backend) and the density ranking (units by decreasing density, as wide
// as their bytes, with the budget line).
func placementSVG(pl *placement.Placement) string {
	roles, byLayer, other := placementGrid(pl)
	const cw, ch, left, top = 70, 12, 60, 60
	mapW := left + cw*len(roles) + 20
	mapH := top + ch*pl.Layers + 40
	rankW, rankH := 640, 360
	width := mapW + rankW + 40
	height := max(mapH, rankH+top+60)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="10">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="14">%s: %s</text>`+"\n", html.EscapeString(filepath.Base(pl.Model)), html.EscapeString(pl.Describe()))
	color := func(backend string) string {
		if backend == executor.BackendGPU {
			return "#2e8b57"
		}
		return "#c8c8c8"
	}
	for j, r := range roles {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", left+cw*j+cw/2, top-8, html.EscapeString(r))
	}
	for l := 0; l < pl.Layers; l++ {
		y := top + ch*l
		if l%4 == 0 {
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%d</text>`+"\n", left-6, y+ch-2, l)
		}
		for j, r := range roles {
			u, ok := byLayer[l][r]
			if !ok {
				continue
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="white"><title>%s: %s, %s</title></rect>`+"\n",
				left+cw*j, y, cw, ch, color(u.Backend), html.EscapeString(u.Name), u.Backend, executor.FormatBytes(u.Bytes))
		}
	}
	y := top + ch*pl.Layers + 16
	for _, u := range other {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s (%s)</text>`+"\n",
			left, y-9, color(u.Backend), left+14, y, html.EscapeString(u.Name), u.Backend)
		y += 14
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d">layer</text>`+"\n", 10, top-8)
	// Density ranking.
	x0, y0 := mapW+30, top
	units := append([]placement.UnitPlacement(nil), pl.Units...)
	sort.SliceStable(units, func(i, j int) bool { return units[i].Density > units[j].Density })
	var total int64
	maxD := 0.0
	for _, u := range units {
		total += u.Bytes
		maxD = math.Max(maxD, usPerMiB(u.Density))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12">units by performance density (decode µs saved per MiB), width = bytes</text>`+"\n", x0, y0-20)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", x0, y0, rankW, rankH)
	if total > 0 && maxD > 0 {
		var acc int64
		for _, u := range units {
			d := math.Max(usPerMiB(u.Density), 0)
			x := float64(x0) + float64(rankW)*float64(acc)/float64(total)
			wd := math.Max(float64(rankW)*float64(u.Bytes)/float64(total), 0.5)
			hgt := float64(rankH) * d / maxD
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"><title>%s: %.2f µs/MiB, %s</title></rect>`+"\n",
				x, float64(y0+rankH)-hgt, wd, hgt, color(u.Backend), html.EscapeString(u.Name), usPerMiB(u.Density), executor.FormatBytes(u.Bytes))
			acc += u.Bytes
		}
		if avail := pl.Budget - pl.FixedBytes; avail > 0 && avail < total {
			bx := float64(x0) + float64(rankW)*float64(avail)/float64(total)
			fmt.Fprintf(&b, `<line x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="#d22" stroke-width="2" stroke-dasharray="6,3"/>`+"\n", bx, y0-4, bx, y0+rankH+4)
			fmt.Fprintf(&b, `<text x="%.2f" y="%d" fill="#d22">budget for units: %s</text>`+"\n", bx+4, y0+12, executor.FormatBytes(avail))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">0</text><text x="%d" y="%d" text-anchor="end">%s</text>`+"\n",
			x0, y0+rankH+14, x0+rankW, y0+rankH+14, executor.FormatBytes(total))
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%.1f</text>`+"\n", x0-4, y0+10, maxD)
	} else {
		fmt.Fprintf(&b, `<text x="%d" y="%d">no profile: %s</text>`+"\n", x0+10, y0+20, html.EscapeString(pl.Note))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">GPU (resident)</text>`+"\n", x0, y0+rankH+24, color("gpu"), x0+14, y0+rankH+33)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">CPU</text>`+"\n", x0+120, y0+rankH+24, color("cpu"), x0+134, y0+rankH+33)
	b.WriteString("</svg>\n")
	return b.String()
}
