package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/placement"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/stress"
	"github.com/spf13/cobra"
)

// The load experiments of `ats bench --stress`: a competing program that
// takes a share of the CPU cores, or of the GPU and its link, while the
// benchmark measures decode with and without dynamic promotion.

func init() {
	register(func() *cobra.Command {
		var cpuPct, gpuPct int
		cmd := &cobra.Command{
			Use:    "stress [--cpu PCT] [--gpu PCT]",
			Short:  "Load the machine until interrupted (the competing load of ats bench --stress)",
			Hidden: true,
			Args:   cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				res, err := stress.Stress(ctx, cpuPct, gpuPct, cmd.OutOrStdout())
				if res.LinkBytes > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "stress: %s host to device in %.1f s: %.1f GB/s on average\n",
						executor.FormatBytes(res.LinkBytes), res.Elapsed.Seconds(), res.LinkGBps())
				}
				return err
			},
		}
		cmd.Flags().IntVar(&cpuPct, "cpu", 0, "percent of the CPU's threads to keep busy")
		cmd.Flags().IntVar(&gpuPct, "gpu", 0, "percent of the time to keep the GPU's memory and link busy")
		return cmd
	})
}

// parseStress reads --stress cpu=60 or gpu=60.
func parseStress(s string) (kind string, pct int, err error) {
	k, v, ok := strings.Cut(s, "=")
	n, e := strconv.Atoi(v)
	if !ok || (k != "cpu" && k != "gpu") || e != nil || n < 1 || n > 100 {
		return "", 0, fmt.Errorf("--stress %q: want cpu=PCT or gpu=PCT, PCT from 1 to 100", s)
	}
	return k, n, nil
}

// startStress runs `ats stress` in a child process; stop ends it.
func startStress(kind string, pct int) (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := exec.Command(self, "stress", fmt.Sprintf("--%s=%d", kind, pct))
	c.Stderr = os.Stderr
	end, err := stress.StartLoad(c, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("the %s stress: %w", kind, err)
	}
	return func() {
		if err := end(); err != nil {
			fmt.Fprintln(os.Stderr, "ats:", err)
		}
	}, nil
}

// stressBench measures decode (tg of n tokens, reps runs) static and with
// dynamic promotion, each without and under the competing load, and writes
// the time per output token and the degradations.
func stressBench(stdout, stderr io.Writer, m *model.Model, o benchOptions, threads, nGen int, kind string, pct int) error {
	type result struct {
		dynamic, stressed bool
		tpot              float64
		promo             placement.PromotionStats
	}
	var rs []result
	for _, stressed := range []bool{false, true} {
		var stop func()
		if stressed {
			var err error
			if stop, err = startStress(kind, pct); err != nil {
				return err
			}
		}
		for _, dynamic := range []bool{false, true} {
			copt := session.Options{Threads: threads, CtxSize: nGen + 8, Batch: o.batch}
			pf := o.place
			pf.dynamic = dynamic
			if err := pf.apply(&copt, stderr); err != nil {
				return err
			}
			c, err := session.NewEngine(m, copt)
			if err != nil {
				if stop != nil {
					stop()
				}
				return err
			}
			seq := c.Ctx.KV().NewSeq()
			var total time.Duration
			for r := 0; r <= o.reps; r++ { // the first run warms up
				seq.Truncate(0)
				start := time.Now()
				tok := 1
				for i := 0; i < nGen; i++ {
					l, err := c.Eval(seq, []int{tok}, false)
					if err != nil {
						c.Close()
						return err
					}
					tok = argmaxIn(l, m.Hyper().NVocab)
				}
				if r > 0 {
					total += time.Since(start)
				}
			}
			tpot := total.Seconds() / float64(o.reps*nGen)
			rs = append(rs, result{dynamic: dynamic, stressed: stressed, tpot: tpot, promo: c.Promoter.Stats()})
			fmt.Fprintf(stderr, "ats: stress %s=%d%% %v, dynamic %v: %.2f ms a token; %s\n", kind, pct, stressed, dynamic, 1e3*tpot, describePromotion(c.Promoter.Stats()))
			c.Close()
		}
		if stop != nil {
			stop()
		}
	}
	get := func(dynamic, stressed bool) float64 {
		for _, r := range rs {
			if r.dynamic == dynamic && r.stressed == stressed {
				return r.tpot
			}
		}
		return 0
	}
	fmt.Fprintf(stdout, "| placement | no load: ms/token | %s=%d%%: ms/token | degradation |\n| --- | ---: | ---: | ---: |\n", kind, pct)
	deg := map[bool]float64{}
	for _, dynamic := range []bool{false, true} {
		name := "static"
		if dynamic {
			name = "dynamic promotion"
		}
		a, b := get(dynamic, false), get(dynamic, true)
		deg[dynamic] = b/a - 1
		fmt.Fprintf(stdout, "| %s | %.2f | %.2f | %+.1f%% |\n", name, 1e3*a, 1e3*b, 100*deg[dynamic])
	}
	if deg[false] > 0 {
		fmt.Fprintf(stdout, "\ndynamic promotion cuts the degradation by %.0f%% (%s=%d%%, %d threads, tg%d, %d runs)\n",
			100*(1-deg[true]/deg[false]), kind, pct, threads, nGen, o.reps)
	}
	return nil
}

func argmaxIn(l []float32, n int) int {
	best := 0
	for i := 1; i < min(n, len(l)); i++ {
		if l[i] > l[best] {
			best = i
		}
	}
	return best
}

// describePromotion says what dynamic promotion did in a line.
func describePromotion(p placement.PromotionStats) string {
	if !p.On {
		return "no promotion"
	}
	how := "copied each step"
	if p.Kept {
		how = "kept in the ring"
	}
	return fmt.Sprintf("promotes %d units (%s, %s) a step, copies %s a step on average; %d re-plans, the last took %v (its DPs %v; all %v); estimates: CPU ×%.2f, GPU ×%.2f, link %.1f GB/s, overlap ×%.2f, hand-over %v",
		p.PromotedUnits, executor.FormatBytes(p.PromotedBytes), how, executor.FormatBytes(p.CopiedPerStep), p.Replans, p.LastPlanCost.Round(time.Microsecond), p.LastDPCost.Round(time.Microsecond), p.PlanCost.Round(time.Microsecond),
		p.Estimates.CPU, p.Estimates.GPU, p.Estimates.Link/1e9, p.Estimates.Overlap, p.Switch.Round(100*time.Nanosecond))
}
