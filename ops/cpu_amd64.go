//go:build !noasm

package ops

import "github.com/klauspost/cpuid/v2"

// archLevels are the levels this CPU runs, from generic up.
var archLevels = detectLevels()

func detectLevels() []Level {
	ls := []Level{LevelGeneric}
	c := &cpuid.CPU
	if !c.Supports(cpuid.AVX, cpuid.AVX2, cpuid.FMA3, cpuid.F16C) {
		return ls
	}
	ls = append(ls, LevelAVX2)
	// AVX-VNNI is chosen where AVX-512 is absent (Alder Lake and later
	// client cores, Zen 5 client); with AVX-512 it stays available to
	// ATS_CPU=avxvnni and to the tests.
	if c.Supports(cpuid.AVXVNNI) {
		ls = append(ls, LevelAVXVNNI)
	}
	if !c.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.AVX512VL, cpuid.AVX512DQ) {
		return ls
	}
	ls = append(ls, LevelAVX512)
	if c.Supports(cpuid.AVX512VNNI) {
		ls = append(ls, LevelAVX512VNNI)
	}
	return ls
}
