package cuda

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestRoutedPick checks the device's share of a routed layer's experts:
// the highest-numbered of the experts the slots chose, share of them
// rounded and at most most; every slot of those experts gets its expert's
// index among the picked, every other slot -1 and an expert below ks.
func TestRoutedPick(t *testing.T) {
	cases := []struct {
		ids      []int32
		ne       int
		share    float64
		most     int
		wantKs   int
		wantPick []int32
		wantDev  []int32
	}{
		// One token of top 4: half of 4 experts, the two highest.
		{[]int32{7, 2, 90, 31}, 128, 0.5, 8, 31, []int32{31, 90}, []int32{-1, -1, 1, 0}},
		// None: the host keeps them all.
		{[]int32{7, 2, 90, 31}, 128, 0, 8, 128, nil, []int32{-1, -1, -1, -1}},
		// All, but at most 3.
		{[]int32{7, 2, 90, 31}, 128, 1, 3, 7, []int32{7, 31, 90}, []int32{0, -1, 2, 1}},
		// Two tokens sharing experts: 4 distinct, a third rounds to 1,
		// two thirds to 3.
		{[]int32{5, 9, 1, 9, 5, 12}, 16, 1.0 / 3, 16, 12, []int32{12}, []int32{-1, -1, -1, -1, -1, 0}},
		{[]int32{5, 9, 1, 9, 5, 12}, 16, 2.0 / 3, 16, 5, []int32{5, 9, 12}, []int32{0, 1, -1, 1, 0, 2}},
	}
	for _, c := range cases {
		dev := make([]int32, len(c.ids))
		ks, pick := routedPick(c.ids, c.ne, c.share, c.most, nil, dev)
		if ks != c.wantKs || !slices.Equal(pick, c.wantPick) || !slices.Equal(dev, c.wantDev) {
			t.Errorf("routedPick(%v, %d, %g, %d) = %d, %v, %v; want %d, %v, %v", c.ids, c.ne, c.share, c.most, ks, pick, dev, c.wantKs, c.wantPick, c.wantDev)
		}
	}
	// Random routings: the picked are distinct chosen experts at or above
	// ks, every chosen expert below ks is the host's, and the slots agree.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		ne, k, n := 2+rng.IntN(127), 1+rng.IntN(8), 1+rng.IntN(8)
		k = min(k, ne)
		ids := make([]int32, n*k)
		for i := range ids {
			ids[i] = int32(rng.IntN(ne))
		}
		share, most := rng.Float64(), 1+rng.IntN(ne)
		dev := make([]int32, len(ids))
		ks, pick := routedPick(ids, ne, share, most, make([]int32, 0, 4), dev)
		chosen := map[int32]bool{}
		for _, e := range ids {
			chosen[e] = true
		}
		want := min(int(share*float64(len(chosen))+0.5), most)
		var above []int32
		for e := range chosen {
			if int(e) >= ks {
				above = append(above, e)
			}
		}
		slices.Sort(above)
		if len(pick) != want || !cmp.Equal(pick, above, cmpopts.EquateEmpty()) {
			t.Fatalf("ids %v share %g most %d: ks %d, pick %v; want %d picked, the chosen at or above ks %v", ids, share, most, ks, pick, want, above)
		}
		for i, e := range ids {
			if int(e) >= ks && (dev[i] < 0 || pick[dev[i]] != e) || int(e) < ks && dev[i] != -1 {
				t.Fatalf("ids %v: slot %d (expert %d, ks %d) has device index %d of %v", ids, i, e, ks, dev[i], pick)
			}
		}
	}
}

// TestKeepPace checks that a routed layer's share settles where the host
// and the device finish together: a host that takes (1-share)·host and a
// device that takes share·device balance at host/(host+device), whichever
// side the share starts on, and the share stays within [0, 1] when one
// side is always first.
func TestKeepPace(t *testing.T) {
	cases := []struct{ host, device, start float64 }{
		{1, 1, 0.4},
		{0.8, 2.4, 0.4}, // the link three times slower: a quarter
		{3, 1, 0.1},
		{1, 0, 0.5}, // a device that takes no time gets everything
		{0, 1, 0.5}, // a host that takes no time keeps everything
	}
	for _, c := range cases {
		s := c.start
		for range 2000 {
			s = keepPace(s, s*c.device < (1-s)*c.host)
			if s < 0 || s > 1 {
				t.Fatalf("host %g, device %g: share %g outside [0, 1]", c.host, c.device, s)
			}
		}
		want := 1.0
		if c.host+c.device > 0 {
			want = c.host / (c.host + c.device)
		}
		if d := s - want; d > 2*routedShareStep || d < -2*routedShareStep {
			t.Errorf("host %g, device %g from %g: share %g, want %g within two steps", c.host, c.device, c.start, s, want)
		}
	}
}
