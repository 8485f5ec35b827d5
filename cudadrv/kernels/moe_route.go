package kernels

import (
	"fmt"

	"github.com/atsinfer/ats/cudadrv"
)

// MoERoute holds the kernels of moe_route.cu (top-k routing and the
// weighted sum of expert outputs) for one context.
type MoERoute struct {
	lazyModule
	route       *cudadrv.Function
	weightedSum *cudadrv.Function
	split       *cudadrv.Function
}

// NewMoERoute prepares moe_route.cu's kernels for the context's device; the
// module loads at the first launch.
func NewMoERoute(ctx *cudadrv.Context) (*MoERoute, error) {
	k := &MoERoute{}
	err := k.prepareLookup(ctx, "moe_route", map[string]**cudadrv.Function{
		"moe_route":        &k.route,
		"moe_weighted_sum": &k.weightedSum,
		"moe_split":        &k.split,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// LoadMoERoute is NewMoERoute with the module loaded now.
func LoadMoERoute(ctx *cudadrv.Context) (*MoERoute, error) { return loadNow(NewMoERoute(ctx)) }

// MaxExperts and MaxTopK bound what Route handles (a warp holds every
// expert's probability in registers, one lane keeps each chosen one).
const (
	MaxExperts = 256
	MaxTopK    = 32
)

// Route queues the routing of nTok tokens: softmax over each row of logits
// ([nTok][ne] float), the topK most probable experts (ties: lower id
// first), their probabilities renormalised to sum to 1 when norm is set.
// ids ([nTok][topK] int32) and weights ([nTok][topK] float) stay on the
// device for the expert products.
func (k *MoERoute) Route(s *cudadrv.Stream, logits cudadrv.DevicePtr, ne, topK int, norm bool, ids, weights cudadrv.DevicePtr, nTok int) error {
	if ne < 1 || ne > MaxExperts || topK < 1 || topK > min(ne, MaxTopK) {
		return fmt.Errorf("kernels: moe routing of top %d of %d experts: supported up to %d experts and top %d", topK, ne, MaxExperts, MaxTopK)
	}
	if nTok == 0 {
		return nil
	}
	const warpsPerBlock = 4
	nb := 0
	if norm {
		nb = 1
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.route, s, cudadrv.D1(cudadrv.Blocks(nTok, warpsPerBlock)), cudadrv.D1(32*warpsPerBlock), 0, func(a *cudadrv.Args) {
		a.Ptr(logits).I32(int32(ne)).I32(int32(topK)).I32(int32(nb)).Ptr(ids).Ptr(weights).I32(int32(nTok))
	})
}

// WeightedSum queues out[t] = Σ_j y[t][j] * w[t][j] over the topK slots in
// order: y is [nTok][topK][width], w [nTok][topK], out [nTok][width].
func (k *MoERoute) WeightedSum(s *cudadrv.Stream, out, y, w cudadrv.DevicePtr, width, topK, nTok int) error {
	return k.WeightedSumHost(s, out, y, w, 0, 0, width, topK, nTok)
}

// Split queues the hand-over of an MoE layer's slots to the host: every
// slot's id and weight (ids, weights: [nSlots] on the device) are copied to
// hostIDs and hostWeights (device addresses of mapped host memory), and
// the device ids of the slots whose expert is below ks become -1, so that
// the expert products (MoEMatMul) and WeightedSumHost leave them to the
// host.
func (k *MoERoute) Split(s *cudadrv.Stream, ids, weights cudadrv.DevicePtr, ks, nSlots int, hostIDs, hostWeights cudadrv.DevicePtr) error {
	if nSlots == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.split, s, cudadrv.D1(cudadrv.Blocks(nSlots, 256)), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(ids).Ptr(weights).I32(int32(ks)).I32(int32(nSlots)).Ptr(hostIDs).Ptr(hostWeights)
	})
}

// WeightedSumHost queues out[t] = host[t] + Σ_j y[t][j] * w[t][j] over the
// slots j, in order, whose id (ids: [nTok][topK]) is not -1: the host's
// partial sum of the experts it computed (host: [nTok][width], mapped host
// memory) plus the device's slots (after Split). ids and host may be 0:
// every slot counts, and the sum starts from the first product.
func (k *MoERoute) WeightedSumHost(s *cudadrv.Stream, out, y, w, ids, host cudadrv.DevicePtr, width, topK, nTok int) error {
	n := width * nTok
	if n == 0 {
		return nil
	}
	if err := k.ready(); err != nil {
		return err
	}
	return launch(k.weightedSum, s, grid1(n, 256), cudadrv.D1(256), 0, func(a *cudadrv.Args) {
		a.Ptr(out).Ptr(y).Ptr(w).Ptr(ids).Ptr(host).I32(int32(width)).I32(int32(topK)).I32(int32(nTok))
	})
}
