package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal (a progress bar or colours
// would only garble a file or a pipe).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// loadSession opens a model, reads its weights into memory and makes a
// session, showing a progress bar on stderr when it is a terminal (a line
// when it is not). The file is mapped, so opening it costs nothing;
// reading every page now moves the disk time to load time, where the bar
// shows it, instead of the first answer. Later load steps (profiling for
// the GPU placement) report to the same bar.
func loadSession(path string, copt session.Options, stderr io.Writer, warn func(string)) (*session.Session, error) {
	start := time.Now()
	m, err := model.Open(path)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, t := range m.File.Tensors {
		total += int64(len(t.Data))
	}
	var bar *progressbar.ProgressBar
	if isTerminal(stderr) {
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("loading "+filepath.Base(path)),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(50*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetRenderBlankState(true),
		)
	}
	if m.File.Mapped {
		const page = 4096
		const step = 8 << 20 // report every 8 MiB
		for _, t := range m.File.Tensors {
			d := t.Data
			for off := 0; off < len(d); off += step {
				end := min(len(d), off+step)
				var s byte
				for i := off; i < end; i += page {
					s += d[i]
				}
				goruntime.KeepAlive(s) // the reads are the point: keep them
				if bar != nil {
					bar.Add64(int64(end - off))
				}
			}
		}
	} else if bar != nil {
		bar.Set64(total)
	}
	if bar != nil {
		bar.Describe("allocating the context")
	}
	sess, err := session.NewSession(m, copt, warn)
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	fmt.Fprintf(stderr, "ats: loaded %s (%s, %.0f MiB of weights, context %d, %d threads) in %.1fs\n",
		filepath.Base(path), m.Hyper().Arch, float64(m.WeightBytes())/(1<<20), sess.CtxSize(), sess.Ctx.Threads(),
		time.Since(start).Seconds())
	return sess, nil
}
