package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/runtime/session"
)

// The environment's switches reach the engine's options, and a value a
// switch does not know leaves it off.
func TestEnvOptions(t *testing.T) {
	type got struct {
		NoRepack, RepackAll, HostProfile bool
		MoESplit, MoERouted              string
		NoGraphs                         bool
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		want got
	}{
		{"none", nil, got{}},
		{"no repacking", map[string]string{envRepack: "0"}, got{NoRepack: true}},
		{"repack all", map[string]string{envRepack: "all"}, got{RepackAll: true}},
		{"unknown repack value", map[string]string{envRepack: "some"}, got{}},
		{"MoE shares", map[string]string{envMoESplit: "0", envMoERouted: "0.5"}, got{MoESplit: "0", MoERouted: "0.5"}},
		{"profiles and graphs", map[string]string{envCPUProfile: "1", envGPUGraphs: "0"}, got{HostProfile: true, NoGraphs: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, k := range []string{envRepack, envCPUProfile, envGPUGraphs, envMoESplit, envMoERouted} {
				t.Setenv(k, c.env[k])
			}
			var o session.Options
			envOptions(&o)
			g := got{o.NoRepack, o.RepackAll, o.HostProfile, o.MoESplit, o.MoERouted, o.DeviceOptions.NoGraphs}
			if d := cmp.Diff(c.want, g); d != "" {
				t.Errorf("options (-want +got):\n%s", d)
			}
		})
	}
}

// A switch set to a value it does not take is named in a note; unset and
// empty ones, and the values each takes, are not.
func TestEnvIgnored(t *testing.T) {
	for k := range envValues {
		t.Setenv(k, "")
	}
	if got := envIgnored(); len(got) != 0 {
		t.Fatalf("nothing set, notes %q", got)
	}
	t.Setenv(envRepack, "1")
	t.Setenv(envGPUGraphs, "0")
	t.Setenv(envGPUWeights, "f32")
	want := []string{
		`ATS_GPU_WEIGHTS="f32" is not one of ref: ignored`,
		`ATS_REPACK="1" is not one of 0, all: ignored`,
	}
	if d := cmp.Diff(want, envIgnored()); d != "" {
		t.Errorf("notes (-want +got):\n%s", d)
	}
}
