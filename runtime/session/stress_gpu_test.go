package session

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
	"testing"
	"time"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/stress"
)

// The oracles under a competing load: the promoter re-estimates CPU, GPU
// and link speed each step and may re-plan mid-run, the streamed prefill
// shares the link with another program; none of it may change a logit.

// envStressChild makes the test binary the competing load (cpu=PCT or
// gpu=PCT) instead of running tests: the load is another process, as in
// `ats bench --stress`.
const envStressChild = "ATS_TEST_STRESS_CHILD"

func TestMain(m *testing.M) {
	if load := os.Getenv(envStressChild); load != "" {
		os.Exit(stressChild(load))
	}
	os.Exit(m.Run())
}

// stressChild runs the load until SIGTERM or until its parent goes away
// (stdin closes).
func stressChild(load string) int {
	kind, v, _ := strings.Cut(load, "=")
	pct, err := strconv.Atoi(v)
	if err != nil || (kind != "cpu" && kind != "gpu") {
		fmt.Fprintf(os.Stderr, "%s=%q: want cpu=PCT or gpu=PCT\n", envStressChild, load)
		return 2
	}
	// The parent closes stdin and then signals, so the signal often
	// arrives while the load ends. It stays caught until the process has
	// exited: stopping or ignoring it on the way out leaves a moment in
	// which the runtime forwards it to the default action (sigignore
	// clears the Go handler before it installs SIG_IGN), and a loaded
	// machine killed the child there ("signal: terminated").
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-sigs; cancel() }()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	cpu, gpu := 0, 0
	if kind == "cpu" {
		cpu = pct
	} else {
		gpu = pct
	}
	if _, err := stress.Stress(ctx, cpu, gpu, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startStressChild starts this test binary as the load; the test's
// cleanup ends it.
func startStressChild(t *testing.T, load string) *exec.Cmd {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), envStressChild+"="+load)
	c.Stderr = os.Stderr
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stop, err := stress.StartLoad(c, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func TestOraclesUnderStress(t *testing.T) {
	dev := needGPUDevice(t)
	const ctx = 128
	for _, load := range []string{"cpu=60", "gpu=60"} {
		t.Run(load, func(t *testing.T) {
			startStressChild(t, load)
			checkOracleVariants(t, dev, ctx, func(m *model.Model, name string) []oracleVariant {
				every := func(i int, _ model.Unit) bool { return i%2 == 1 }
				return []oracleVariant{
					// Every CPU unit promoted each step, prefill streamed.
					{name: "alternating-promote-all", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, every)}, promoteAll: true},
					// The planner's placement by its profile with the
					// promoter's own choices, re-planned as the load moves
					// its estimates.
					{name: "planned-25%", opt: Options{Backend: executor.BackendAuto, VRAMBudget: m.WeightBytes()/4 + fixedBytesFor(t, m, dev, ctx)}, hybridPlan: true},
					{name: "planned-50%", opt: Options{Backend: executor.BackendAuto, VRAMBudget: m.WeightBytes()/2 + fixedBytesFor(t, m, dev, ctx)}, hybridPlan: true},
				}
			})
		})
	}
}

// TestStressChildStops checks the load's process itself (CPU only): it
// runs while the test does, and ends cleanly with it.
func TestStressChildStops(t *testing.T) {
	var c *exec.Cmd
	t.Run("load", func(t *testing.T) {
		c = startStressChild(t, "cpu=50")
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("the load is not running: %v", err)
		}
	})
	if c == nil || c.ProcessState == nil {
		t.Fatal("the load was not waited for")
	}
	if code := c.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the load exited with %d", code)
	}
}

// TestStartLoadWaitsForTheLoad: a process that never says its load runs
// is not taken for one (and is ended), whether it says something else,
// exits at once, or says it as the load does.
func TestStartLoadWaitsForTheLoad(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("skipping: no sh to stand for a load process")
	}
	for _, c := range []struct{ script, wantErr string }{
		{"echo hello; sleep 30", `wrote "hello"`},
		{"(sleep 30) & echo hello; wait", `wrote "hello"`}, // a grandchild keeps the output open
		{"exit 0", "did not start"},
		{"echo '" + stress.LoadReady + "'; trap 'exit 0' TERM; while :; do sleep 0.05; done", ""},
	} {
		stop, err := stress.StartLoad(exec.Command("sh", "-c", c.script), 5*time.Second)
		if c.wantErr == "" {
			if err != nil {
				t.Fatalf("%q: %v", c.script, err)
			}
			if err := stop(); err != nil {
				t.Errorf("%q: stop: %v", c.script, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%q: error %v, want one saying %q", c.script, err, c.wantErr)
			if err == nil {
				_ = stop()
			}
		}
	}
}
