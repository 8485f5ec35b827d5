//go:build !noasm

package ops

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPackedPaddedTail: a tail of 3, 7 or 15 tokens goes in one call with
// a zero row added (paddedTail); every token's result is the bits it has
// computed alone, in every block of groups, and nothing outside the
// outputs is written (runPacked's guards), with the activations ending
// right at the last row.
func TestPackedPaddedTail(t *testing.T) {
	for _, l := range SupportedLevels() {
		for _, typ := range packTypes {
			mul := archPackedTiles(l, typ, false)
			if mul == nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", l, typ), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(l), 91))
				for _, nTok := range []int{3, 7, 11, 15, 19, 23, 31} {
					// Enough groups for several blocks of groups at 17
					// blocks a row (packedBlockBytes).
					c := newPackCase(typ, 17*qkK, 9*packRows, nTok, true, rng.IntN(64), rng)
					c.xq = c.xq[:(nTok-1)*c.ab+c.nb*blockQ8_K] // checkPacked's least
					got := c.runPacked(t, mul)
					rows := c.groups * packRows
					for tok := range nTok {
						kc := *c.kernelCase
						kc.xq, kc.nTok = c.xq[tok*c.ab:][:c.nb*blockQ8_K], 1
						one := *c
						one.kernelCase = &kc
						if alone := one.runPacked(t, mul); !slices.Equal(got[tok*rows:(tok+1)*rows], alone) {
							t.Fatalf("%d tokens: token %d differs from its result alone", nTok, tok)
						}
					}
				}
			})
		}
	}
}
