// Command tracesvg draws one batch of an `ats --trace` file as an SVG
// timeline: the CPU segments, the GPU compute stream and the copy stream
// as three lanes, so their overlap can be seen in a document.
//
//	go run ./tools/tracesvg -in trace.json -kind decode -index 3 -out decode.svg
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"log"
	"math"
	"os"
	"sort"
	"strings"
)

type event struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat"`
	Ph   string  `json:"ph"`
	TS   float64 `json:"ts"`
	Dur  float64 `json:"dur"`
	TID  int     `json:"tid"`
}

func main() {
	in := flag.String("in", "", "the trace (ats --trace FILE)")
	kind := flag.String("kind", "decode", "decode or prefill")
	index := flag.Int("index", 0, "which batch of that kind (0: the first)")
	out := flag.String("out", "", "the SVG to write")
	start := flag.String("start", "token_embd", "a batch starts at the event whose name begins so (the embedding); empty: at a gap")
	flag.Parse()
	b, err := os.ReadFile(*in)
	if err != nil {
		log.Fatal(err)
	}
	var tr struct {
		TraceEvents []event `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		log.Fatalf("%s: %v", *in, err)
	}
	var evs []event
	for _, e := range tr.TraceEvents {
		if e.Ph == "X" && e.Cat == *kind {
			evs = append(evs, e)
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].TS < evs[j].TS })
	// Batches: runs of events separated by a gap with nothing in flight.
	var batches [][]event
	end := math.Inf(-1)
	for _, e := range evs {
		begins := e.TS > end+200
		if *start != "" {
			begins = strings.HasPrefix(e.Name, *start)
		}
		if begins || len(batches) == 0 {
			batches = append(batches, nil)
		}
		batches[len(batches)-1] = append(batches[len(batches)-1], e)
		end = math.Max(end, e.TS+e.Dur)
	}
	if *index >= len(batches) {
		log.Fatalf("%d %s batches in the trace, no index %d", len(batches), *kind, *index)
	}
	bt := batches[*index]
	t0, t1 := math.Inf(1), math.Inf(-1)
	for _, e := range bt {
		t0, t1 = math.Min(t0, e.TS), math.Max(t1, e.TS+e.Dur)
	}
	const w, lane, left, top = 1200, 36, 170, 50
	x := func(t float64) float64 { return left + (t-t0)/(t1-t0)*(w-left-20) }
	names := map[int]string{1: "CPU (worker pool)", 2: "GPU compute stream", 3: "copy stream (weights)"}
	colors := map[int]string{1: "#4a7ebb", 2: "#2e8b57", 3: "#d08c2e"}
	busy := map[int]float64{}
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, top+3*lane+50)
	fmt.Fprintf(&s, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for _, e := range bt {
		busy[e.TID] += e.Dur
		y := top + (e.TID-1)*lane
		fmt.Fprintf(&s, `<rect x="%.1f" y="%d" width="%.2f" height="%d" fill="%s" stroke="white" stroke-width="0.3"><title>%s: %.3f ms</title></rect>`+"\n",
			x(e.TS), y+4, math.Max(x(e.TS+e.Dur)-x(e.TS), 0.4), lane-8, colors[e.TID], html.EscapeString(e.Name), e.Dur/1e3)
	}
	for tid := 1; tid <= 3; tid++ {
		fmt.Fprintf(&s, `<text x="6" y="%d">%s</text><text x="6" y="%d" fill="#666">busy %.1f ms</text>`+"\n",
			top+(tid-1)*lane+16, names[tid], top+(tid-1)*lane+29, busy[tid]/1e3)
	}
	fmt.Fprintf(&s, `<text x="6" y="20" font-size="14">one %s batch: %.1f ms from the first to the last event</text>`+"\n", *kind, (t1-t0)/1e3)
	for i := 0; i <= 10; i++ {
		t := t0 + (t1-t0)*float64(i)/10
		fmt.Fprintf(&s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ccc"/><text x="%.1f" y="%d" text-anchor="middle" fill="#666">%.1f ms</text>`+"\n",
			x(t), top-4, x(t), top+3*lane, x(t), top+3*lane+16, (t-t0)/1e3)
	}
	s.WriteString("</svg>\n")
	if err := os.WriteFile(*out, []byte(s.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s batch %d of %d, %.1f ms; busy: CPU %.1f ms, GPU %.1f ms, copies %.1f ms\n",
		*out, *kind, *index, len(batches), (t1-t0)/1e3, busy[1]/1e3, busy[2]/1e3, busy[3]/1e3)
}
