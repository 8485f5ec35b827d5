package cuda

// Mixture of experts: routing, the experts' products, and a prefill
// layer split between the host and the device.

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// moeStep compiles an MoE op; without sum, it leaves the weighted sum of
// the experts' outputs to the next step (normExStep).
func (g *Exec) moeStep(op *ir.Op, sum bool, ks int) (step, error) {
	router, err := g.weight(op.W)
	if err != nil {
		return step{}, err
	}
	gate, err := g.weight(op.Gate)
	if err != nil {
		return step{}, err
	}
	up, err := g.weight(op.Up)
	if err != nil {
		return step{}, err
	}
	down, err := g.weight(op.Down)
	if err != nil {
		return step{}, err
	}
	in, out := g.bufs[op.In], g.bufs[op.Out]
	ne, k, ff, emb := router.Rows, op.TopK, gate.Rows, down.Rows
	if ne > kernels.MaxExperts || k > kernels.MaxTopK {
		return step{}, fmt.Errorf("top %d of %d experts: the routing kernel takes up to %d of %d", k, ne, kernels.MaxTopK, kernels.MaxExperts)
	}
	m, w, d := &g.moe, g.w, g.dev
	grp := &group{in: op.In, x: in, cols: emb, moe: true,
		members: []groupMember{{m: gate}, {m: up}, {m: down}}}
	// Gate and up share a launch when both are resident.
	gu, _ := w.(groupedOps)
	if gate.seq >= 0 || up.seq >= 0 {
		gu = nil
	}
	if ks == backend.SplitRouted {
		return step{group: grp, run: func(s *cudadrv.Stream, n int) error {
			return g.moeRouted(s, op, router, gate, up, down, in, out, n)
		}}, nil
	}
	if ks > 0 {
		return step{group: grp, run: func(s *cudadrv.Stream, n int) error {
			return g.moeSplit(s, op, router, gate, up, down, in, out, n, ks)
		}}, nil
	}
	gateUp, gateUpOut := []*mat{gate, up}, []cudadrv.DevicePtr{m.gate, m.up}
	return step{group: grp, run: func(s *cudadrv.Stream, n int) error {
		// Router logits, top-k ids and weights (they stay on the device),
		// gate and up of the chosen experts per slot, SwiGLU, down per
		// slot, and the weighted sum in slot order.
		if err := g.route(s, op, router, in, n); err != nil {
			return err
		}
		if g.format(grp, n) == actQ8_1 && ff%32 == 0 && emb%32 == 0 {
			// Decode: one Q8_1 input for gate and up (written by the norm
			// before, or quantized here), SwiGLU writing down's.
			pm := w.(moePreparedOps)
			if g.q8Ready(grp, n) == 0 {
				if err := w.(preparedOps).Prepare(s, actQ8_1, in, n, emb, g.act); err != nil {
					return err
				}
			}
			done := false
			if gu != nil {
				// Gate and up in one launch.
				var err error
				if done, err = gu.MoEMatMulPreparedGroup(s, gateUp, g.act, m.ids, n, k, gateUpOut); err != nil {
					return err
				}
			}
			if !done {
				if err := g.with(s, gate, func() error { return pm.MoEMatMulPrepared(s, gate, g.act, false, m.ids, n, k, m.gate) }); err != nil {
					return err
				}
				if err := g.with(s, up, func() error { return pm.MoEMatMulPrepared(s, up, g.act, false, m.ids, n, k, m.up) }); err != nil {
					return err
				}
			}
			// g.act is free again: the products above read it first.
			if err := d.glu.SwiGLUQ8(s, m.gate, m.gate, m.up, ff, ff, n*k, g.act, 1); err != nil {
				return err
			}
			if err := g.with(s, down, func() error { return pm.MoEMatMulPrepared(s, down, g.act, true, m.ids, n, k, m.down) }); err != nil {
				return err
			}
		} else if err := g.moeExperts(s, gate, up, down, in, n, k, ff); err != nil {
			return err
		}
		if !sum {
			return nil
		}
		return d.moe.WeightedSum(s, out, m.down, m.weights, emb, k, n)
	}}, nil
}

// moeSplit queues an MoE layer split between the host and the GPU at
// expert ks (SegmentSpec.Split). The GPU routes every token; the slots of
// experts below ks, and the layer's input, go to mapped host memory, and
// the GPU's expert products, which drop those slots, are queued. While the
// GPU computes them (and the copy stream brings the next weights), the
// host computes its experts' share (HostMoE), whose weights never cross
// the link; the GPU then adds its slots onto the host's sum. The host
// blocks here for its share: the layers after need the sum.
func (g *Exec) moeSplit(s *cudadrv.Stream, op *ir.Op, router, gate, up, down *mat, in, out cudadrv.DevicePtr, n, ks int) error {
	m, d, sp := &g.moe, g.dev, &g.split
	k, ff, emb := op.TopK, gate.Rows, down.Rows
	if err := g.route(s, op, router, in, n); err != nil {
		return err
	}
	if err := d.moe.Split(s, m.ids, m.weights, ks, n*k, sp.ids.DevicePtr(), sp.weights.DevicePtr()); err != nil {
		return err
	}
	if err := d.elem.CopyF32(s, sp.x.DevicePtr(), in, n*emb); err != nil {
		return err
	}
	if err := sp.ready.Record(s); err != nil {
		return err
	}
	if err := g.moeExperts(s, gate, up, down, in, n, k, ff); err != nil {
		return err
	}
	g.host.Expect(splitRoutingWait)
	t0 := time.Now()
	if err := sp.ready.Synchronize(); err != nil {
		return fmt.Errorf("waiting for the routing of the host's experts: %w", err)
	}
	t1, cpu0 := time.Now(), processCPUTime()
	x := unsafe.Slice((*float32)(sp.x.Pointer()), n*emb)
	y := unsafe.Slice((*float32)(sp.y.Pointer()), n*emb)
	ids := unsafe.Slice((*int32)(sp.ids.Pointer()), n*k)
	w := unsafe.Slice((*float32)(sp.weights.Pointer()), n*k)
	g.host.Expect(splitShareSpin)
	if err := g.host.MoEPartial(op, n, ks, x, ids, w, y); err != nil {
		return fmt.Errorf("the host's experts 0-%d: %w", ks-1, err)
	}
	t2 := time.Now()
	sp.stats.Layers++
	sp.stats.Slots += len(ids)
	// The host's slots, and how many of its experts had any: a share's
	// time follows its slots, which the routing spreads unevenly over the
	// layers (the trace shows both).
	slots, used := 0, 0
	var routed [kernels.MaxExperts]bool // Route takes at most so many
	for _, e := range ids {
		if e >= 0 && int(e) < ks {
			slots++
			if !routed[e] {
				routed[e], used = true, used+1
			}
		}
	}
	sp.stats.HostSlots += slots
	sp.stats.HostExperts += ks
	sp.stats.HostRouted += used
	sp.stats.HostBytes += (op.Gate.Bytes() + op.Up.Bytes() + op.Down.Bytes()) / int64(op.Gate.Experts()) * int64(used)
	sp.stats.Wait += t1.Sub(t0)
	sp.stats.Host += t2.Sub(t1)
	sp.stats.HostCPU += processCPUTime() - cpu0
	if g.measure {
		g.hostSpans = append(g.hostSpans,
			backend.HostSpan{Name: fmt.Sprintf("layer %d: waiting for the routing", op.Layer), Start: t0, End: t1},
			backend.HostSpan{Name: fmt.Sprintf("layer %d: the CPU's experts 0-%d (%d of them routed, %d slots)", op.Layer, ks-1, used, slots), Start: t1, End: t2})
	}
	return d.moe.WeightedSumHost(s, out, m.down, m.weights, m.ids, sp.y.DevicePtr(), emb, k, n)
}

// moeRouted queues a decode step's routed MoE layer (SplitRouted), whose
// expert stacks stay in host memory. The device routes the tokens and
// hands every slot to the host (Split at the last expert). The host picks
// the device's share of the experts the tokens chose (routedPick), copies
// their weights alone into the routed scratch on the copy stream, and
// queues their slots' products; it computes the other experts' slots
// meanwhile, and the device then adds its slots onto the host's sum.
func (g *Exec) moeRouted(s *cudadrv.Stream, op *ir.Op, router, gate, up, down *mat, in, out cudadrv.DevicePtr, n int) error {
	m, d, sp, r := &g.moe, g.dev, &g.split, &g.routed
	k, ff, emb, ne := op.TopK, gate.Rows, down.Rows, gate.Experts
	if err := g.route(s, op, router, in, n); err != nil {
		return err
	}
	if err := d.moe.Split(s, m.ids, m.weights, ne, n*k, sp.ids.DevicePtr(), sp.weights.DevicePtr()); err != nil {
		return err
	}
	if err := d.elem.CopyF32(s, sp.x.DevicePtr(), in, n*emb); err != nil {
		return err
	}
	if err := sp.ready.Record(s); err != nil {
		return err
	}
	g.host.Expect(splitRoutingWait)
	t0 := time.Now()
	if err := sp.ready.Synchronize(); err != nil {
		return fmt.Errorf("waiting for the routing of layer %d: %w", op.Layer, err)
	}
	t1 := time.Now()
	x := unsafe.Slice((*float32)(sp.x.Pointer()), n*emb)
	y := unsafe.Slice((*float32)(sp.y.Pointer()), n*emb)
	ids := unsafe.Slice((*int32)(sp.ids.Pointer()), n*k)
	w := unsafe.Slice((*float32)(sp.weights.Pointer()), n*k)
	devIDs := unsafe.Slice((*int32)(r.ids.Pointer()), n*k)
	size := min(n, len(r.share)-1)
	share := r.share[size]
	var ks int
	ks, r.pick = routedPick(ids, ne, share, r.most, r.pick[:0], devIDs)
	// The host's share starts now, beside the copies and launches below
	// (tens of microseconds of driver calls a layer).
	g.host.Expect(splitShareSpin)
	hostDone := make(chan error, 1)
	go func() { hostDone <- g.host.MoEPartial(op, n, ks, x, ids, w, y) }()
	var copied int64
	if len(r.pick) > 0 {
		// The slots' device ids (after Split, which left them all -1),
		// then the picked experts' weights; the products wait for both.
		if err := s.CopyHtoD(m.ids, r.ids.Bytes()[:4*n*k]); err != nil {
			<-hostDone
			return fmt.Errorf("layer %d's routed ids: %w", op.Layer, err)
		}
		// The kernels find expert i of a stack at i times its experts'
		// bytes: the picked experts lie so, region by region.
		var local [3]mat
		region := r.base
		for j, src := range []*mat{gate, up, down} {
			per := len(src.W.Data) / ne
			for i, e := range r.pick {
				b := g.reg.source(src.W.Data[int(e)*per : (int(e)+1)*per])
				if err := g.cs.CopyHtoD(region.Add(i*per), b); err != nil {
					<-hostDone
					return fmt.Errorf("layer %d: copying expert %d of %s: %w", op.Layer, e, src.W.Name, err)
				}
				copied += int64(per)
			}
			local[j] = mat{W: src.W, Ptr: region, Rows: src.Rows, Cols: src.Cols, Experts: len(r.pick), seq: -1}
			region = region.Add(int(align(int64(r.most) * r.per[j])))
		}
		err := errors.Join(r.copied.Record(g.cs), s.WaitEvent(r.copied))
		if err == nil {
			err = g.moeExperts(s, &local[0], &local[1], &local[2], in, n, k, ff)
		}
		if err == nil && !g.cfg.RoutedFixed { // keepPace asks whether they are done
			err = r.done.Record(s)
		}
		if err != nil {
			<-hostDone // y and the slots stay the host's until it is done
			return fmt.Errorf("layer %d's routed experts: %w", op.Layer, err)
		}
	}
	if err := <-hostDone; err != nil {
		return fmt.Errorf("the host's experts 0-%d: %w", ks-1, err)
	}
	t2 := time.Now()
	if !g.cfg.RoutedFixed {
		deviceFirst := true // with nothing to do, it waits for the host
		if len(r.pick) > 0 {
			var err error
			if deviceFirst, err = r.done.Done(); err != nil {
				return fmt.Errorf("layer %d's routed experts: %w", op.Layer, err)
			}
		}
		r.share[size] = keepPace(share, deviceFirst)
	}
	slots, used := 0, 0
	var routed [kernels.MaxExperts]bool
	for _, e := range ids {
		if int(e) < ks {
			slots++
			if !routed[e] {
				routed[e], used = true, used+1
			}
		}
	}
	st := &sp.stats
	st.RoutedLayers++
	st.RoutedHostExperts += used
	st.DeviceExperts += len(r.pick)
	st.CopiedBytes += copied
	st.RoutedWait += t1.Sub(t0)
	st.RoutedHost += t2.Sub(t1)
	if g.measure {
		g.hostSpans = append(g.hostSpans,
			backend.HostSpan{Name: fmt.Sprintf("layer %d: waiting for the routing", op.Layer), Start: t0, End: t1},
			backend.HostSpan{Name: fmt.Sprintf("layer %d: the CPU's %d routed experts (%d slots); the GPU's %d", op.Layer, used, slots, len(r.pick)), Start: t1, End: t2})
	}
	return d.moe.WeightedSumHost(s, out, m.down, m.weights, m.ids, sp.y.DevicePtr(), emb, k, n)
}

// routedPick picks the device's share of a routed layer's experts: of the
// distinct experts the slots chose (ids, all below ne), share of them
// rounded (at most most), the highest-numbered ones. Any would do, since
// an expert's number means nothing, and so the host keeps a range: it
// computes the slots of experts below ks. pick is the device's experts,
// ascending, appended to buf; dev gets each slot's index among them, or
// -1 for the host's slots.
func routedPick(ids []int32, ne int, share float64, most int, buf []int32, dev []int32) (ks int, pick []int32) {
	var chose [kernels.MaxExperts]bool
	distinct := 0
	for _, e := range ids {
		if !chose[e] {
			chose[e], distinct = true, distinct+1
		}
	}
	take := min(int(share*float64(distinct)+0.5), most, distinct)
	ks, pick = ne, buf
	for e := ne - 1; e >= 0 && len(pick) < take; e-- {
		if chose[e] {
			pick = append(pick, int32(e))
			ks = e
		}
	}
	slices.Reverse(pick)
	for i, e := range ids {
		dev[i] = -1
		if int(e) >= ks {
			j, _ := slices.BinarySearch(pick, e)
			dev[i] = int32(j)
		}
	}
	return ks, pick
}

// routedSizes bounds the step sizes that keep a share of their own: 1 to
// 15 tokens each, 16 and more together (index 0 is unused).
const routedSizes = 17

// keepPace moves a routed layer's device share by routedShareStep toward
// the share with which the host and the device finish together: up when
// the device was done first (it then waited on the host), down when the
// host was. Host memory feeds both the host's reads and the link's
// copies, so the rates the planner measured alone do not hold when both
// run, nor for steps of other sizes; the balance found so holds for the
// machine as it is. At one step per layer it crosses the range in a few
// decode steps and then dithers about the balance.
func keepPace(share float64, deviceFirst bool) float64 {
	if deviceFirst {
		return min(share+routedShareStep, 1)
	}
	return max(share-routedShareStep, 0)
}

// routedShareStep is keepPace's step: about a sixteenth of an expert at
// the 29 distinct experts four tokens of Qwen3-30B-A3B choose in a layer,
// 0.07 of the share a decode step of its 36 routed layers.
const routedShareStep = 1.0 / 512

// splitRoutingWait bounds how long the host's workers spin for their share
// of a split expert layer, from when the split is queued, through the wait
// for its routing (about 1 ms, rarely over 3 on the GPU machine), so that
// the share starts on every thread at once: past it they park, as they
// would anyway.
const splitRoutingWait = 5 * time.Millisecond

// splitShareSpin bounds how long the host's workers spin once the share
// starts, so that none parks between its dispatches (each parked worker
// took 0.1-0.8 ms to run again on the GPU machine): the shares take 1-12
// ms there.
const splitShareSpin = 15 * time.Millisecond

// route queues an MoE op's routing of n tokens: the router's logits, then
// each token's top-k experts and their weights (g.moe.ids, weights).
func (g *Exec) route(s *cudadrv.Stream, op *ir.Op, router *mat, in cudadrv.DevicePtr, n int) error {
	m := &g.moe
	if err := g.with(s, router, func() error { return g.routerLogits(s, router, in, n, m.probs) }); err != nil {
		return err
	}
	if err := g.dev.moe.Route(s, m.probs, router.Rows, op.TopK, op.NormTopK, m.ids, m.weights, n); err != nil {
		return err
	}
	if g.routeInspector != nil {
		return g.inspectRoute(s, op, n)
	}
	return nil
}

// routerLogits queues the MoE router's product: the logits of n tokens
// ([n][experts]) from the op's input in. A float32 router (llama.cpp's
// quantizer keeps it so) is multiplied in float32 at any batch, as the CPU
// and llama.cpp multiply it: above the matrix-vector path's batch the
// weight kernels would round its weights and the activations to f16 for
// the tensor cores, and the logits' last bits decide near-tied expert
// choices. The float32 layout of an F32 tensor is the same on both weight
// paths (the file's bytes, or the reference path's dequantized copy).
func (g *Exec) routerLogits(s *cudadrv.Stream, router *mat, in cudadrv.DevicePtr, n int, out cudadrv.DevicePtr) error {
	if router.W.Type == gguf.TypeF32 && n > kernels.MatVecMaxTokens {
		return g.dev.dense.MatMulTiled(s, out, router.Ptr, in, router.Rows, router.Cols, n, router.Rows)
	}
	return g.w.MatMul(s, router, in, n, out, router.Rows, g.scratch)
}

// moeExperts queues the expert products of an MoE op through MoEMatMul,
// which prepares its inputs itself. Where the kernels can (moeReuseOps),
// up takes gate's grouping of the slots and gathered input, and down the
// grouping.
func (g *Exec) moeExperts(s *cudadrv.Stream, gate, up, down *mat, in cudadrv.DevicePtr, n, k, ff int) error {
	m, w := &g.moe, g.w
	mm := func(mt *mat, x cudadrv.DevicePtr, perSlot bool, out cudadrv.DevicePtr, reuse kernels.MoEReuse) error {
		if r, ok := w.(moeReuseOps); ok {
			return r.MoEMatMulReusing(s, mt, x, perSlot, m.ids, n, k, out, g.scratch, reuse)
		}
		return w.MoEMatMul(s, mt, x, perSlot, m.ids, n, k, out, g.scratch)
	}
	if err := g.with(s, gate, func() error { return mm(gate, in, false, m.gate, kernels.MoEReuseNothing) }); err != nil {
		return err
	}
	if err := g.with(s, up, func() error { return mm(up, in, false, m.up, kernels.MoEReuseInput) }); err != nil {
		return err
	}
	if err := g.dev.glu.SwiGLU(s, m.gate, m.gate, m.up, ff, ff, n*k); err != nil {
		return err
	}
	return g.with(s, down, func() error { return mm(down, m.gate, true, m.down, kernels.MoEReuseGroups) })
}

// moeReuseOps is implemented by weight kernels whose MoE products can
// take the grouping (and gathered input) of the product before them.
type moeReuseOps interface {
	MoEMatMulReusing(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr, reuse kernels.MoEReuse) error
}
