package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Profile is what a model's units measured on this machine: the seconds
// each takes on the CPU and on the GPU (weights resident) at decode and at
// prefill batch sizes, the cost of moving activations between the two,
// and the link's speed for streaming weights. The runtime measures it
// (runtime/profile.go); plan only reads it.
type Profile struct {
	Version  int       `json:"version"`
	Key      string    `json:"key"`   // see ProfileKey
	Model    string    `json:"model"` // file name, for people
	Hardware Hardware  `json:"hardware"`
	Created  time.Time `json:"created"`
	Took     float64   `json:"took_s"` // seconds the measurement took
	Batches  []int     `json:"batches"`
	// DecodePos is the cache position at which decode attention was timed.
	DecodePos int         `json:"decode_pos"`
	Units     []UnitTimes `json:"units"`    // by unit index
	Switch    []Link      `json:"switch"`   // by batch: activation transfers (zero-copy kernels and a wait)
	Stream    Link        `json:"stream"`   // weight copies from the model file to the staging ring
	Pinned    bool        `json:"pinned"`   // whether the model file was page-locked for those copies
	Measured  int         `json:"measured"` // distinct unit shapes measured
	// HostRead is the rate at which all the CPU's threads together read
	// host memory (bytes/s); no unit's decode time on the CPU is taken
	// below its weights at that rate (0: not measured, no floor).
	HostRead float64 `json:"host_read_bytes_per_s,omitempty"`
	// DepthPos is how much further into the cache the units whose work
	// grows with the context were timed again (UnitTimes.CPUPerPos).
	DepthPos int `json:"depth_pos,omitempty"`
}

// ProfileVersion changes whenever what a profile means changes; older
// cached profiles are measured again. 3: the CPU's times from repacked
// copies (UnitTimes.CPUPacked), the CPU's kernel level in the hardware.
// 4: decode times on the CPU floored by the host memory's rate (HostRead).
// 5: the CPU's share of a split MoE layer (UnitTimes.CPUShare).
// 6: attention timed at depth too (UnitTimes.CPUPerPos, GPUPerPos).
const ProfileVersion = 6

// UnitTimes are one unit's figures, by batch index (Profile.Batches).
type UnitTimes struct {
	Name string `json:"name"`
	Sig  string `json:"sig"` // units of one signature share a measurement
	// CPU and GPU: seconds within a run of units on the same backend (the
	// fusions with the unit before hold); the Alone figures: the unit run
	// by itself.
	CPU      []float64 `json:"cpu_s"`
	GPU      []float64 `json:"gpu_s"`
	CPUAlone []float64 `json:"cpu_alone_s"`
	GPUAlone []float64 `json:"gpu_alone_s"`
	// CPUPacked and CPUPackedAlone are the CPU's times when the unit's
	// matrices are read from repacked copies (interleaved rows, faster
	// kernels), which a hybrid context makes for its CPU units' matrices
	// as far as host memory allows; empty for a unit that has none to
	// repack (the embedding, attention, types without such a layout at
	// the CPU's kernel level). CPU and CPUAlone are the file's layout.
	CPUPacked      []float64 `json:"cpu_packed_s,omitempty"`
	CPUPackedAlone []float64 `json:"cpu_packed_alone_s,omitempty"`
	// CPUShare, for an MoE unit the CPU can split with the GPU, is the
	// CPU's time for the first quarter of its experts from repacked
	// copies, the routing given (a split prefill layer's CPU share,
	// without the routing, the grouping of every slot and the sum that
	// the whole op's times include); empty otherwise.
	CPUShare []float64 `json:"cpu_share_s,omitempty"`
	// CPUPerPos and GPUPerPos, for a unit whose work grows with the
	// context (attention: its scores and its reads of the KV cache), are
	// the seconds each row of a batch adds per position of context before
	// it, by batch: the unit was timed with its rows DepthPos positions
	// further into the cache than the other figures. Empty otherwise.
	CPUPerPos []float64 `json:"cpu_per_pos_s,omitempty"`
	GPUPerPos []float64 `json:"gpu_per_pos_s,omitempty"`
}

// Link is a measured transfer path: a fixed cost per transfer and a rate.
type Link struct {
	Latency     float64 `json:"latency_s"`
	BytesPerSec float64 `json:"bytes_per_s"`
}

// Time is the seconds to move n bytes.
func (l Link) Time(n int64) float64 {
	if l.BytesPerSec <= 0 {
		return l.Latency
	}
	return l.Latency + float64(n)/l.BytesPerSec
}

// Hardware identifies the machine a profile was measured on.
type Hardware struct {
	CPU     string `json:"cpu"`
	Cores   int    `json:"cores"`
	Threads int    `json:"threads"`
	// CPULevel is the CPU kernels' instruction level, "+amx" where AMX
	// tiles compute the products of many tokens (ATS_CPU may lower
	// it; a build without assembly has only the generic one).
	CPULevel string `json:"cpu_level,omitempty"`
	GPU      string `json:"gpu"`
	Driver   string `json:"driver"`
	VRAM     int64  `json:"vram_bytes"`
}

// ProfileKey names the profile of a model on a machine: a hash of the
// model file's identity (its header and tensor table, as the caller
// digests it), the hardware fingerprint, the batch sizes and the
// profile's version.
func ProfileKey(modelID string, hw Hardware, batches []int) string {
	h := sha256.New()
	fmt.Fprintf(h, "v%d\n%s\n%+v\n%v\n", ProfileVersion, modelID, hw, batches)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Packed is the profile as it applies when the CPU reads the fraction
// frac[i] (by bytes) of unit i's matrices from repacked copies: each
// unit's CPU times between those of the file's layout and the repacked
// ones (a unit without repacked times, or beyond frac, keeps its own). p
// is not changed.
func (p *Profile) Packed(frac []float64) *Profile {
	q := *p
	q.Units = slices.Clone(p.Units)
	for i := range q.Units {
		u := &q.Units[i]
		if i >= len(frac) || frac[i] <= 0 || len(u.CPUPacked) != len(u.CPU) || len(u.CPUPackedAlone) != len(u.CPUAlone) {
			continue
		}
		f := min(frac[i], 1)
		mix := func(plain, packed []float64) []float64 {
			out := make([]float64, len(plain))
			for b := range out {
				out[b] = (1-f)*plain[b] + f*packed[b]
			}
			return out
		}
		u.CPU, u.CPUAlone = mix(u.CPU, u.CPUPacked), mix(u.CPUAlone, u.CPUPackedAlone)
	}
	return &q
}

// Shaped is the profile of steps of rows rows at depth: every row
// attends to depth positions of context beyond the profile's own (a
// decode row to DecodePos, a prefill row to the rows before it in its
// batch; negative when the context is shorter). It has one batch,
// [rows]: each time lies on the line through the two profiled batches
// around rows (the last two beyond the largest, the smallest's time below
// it), and the units whose work grows with the context add rows*depth of
// their per-position seconds, never below half their time. The switch is
// the nearest batch's. p, whose batches ascend, is not changed.
func (p *Profile) Shaped(rows, depth int) *Profile {
	rows = max(rows, 1)
	n := len(p.Batches)
	lo, hi := 0, 0
	switch {
	case rows <= p.Batches[0]:
	case rows >= p.Batches[n-1]:
		lo, hi = max(n-2, 0), n-1
	default:
		for hi = 1; p.Batches[hi] < rows; hi++ {
		}
		lo = hi - 1
	}
	w := 0.0
	if b0, b1 := p.Batches[lo], p.Batches[hi]; b1 != b0 {
		w = float64(rows-b0) / float64(b1-b0)
	}
	at := func(v []float64) []float64 {
		if len(v) != len(p.Batches) {
			return nil
		}
		return []float64{v[lo] + w*(v[hi]-v[lo])}
	}
	q := *p
	q.Batches = []int{rows}
	q.Switch = nil
	if len(p.Switch) == len(p.Batches) {
		q.Switch = []Link{p.Switch[p.BatchIndex(rows)]}
	}
	q.Units = make([]UnitTimes, len(p.Units))
	for i, u := range p.Units {
		t := UnitTimes{Name: u.Name, Sig: u.Sig, CPU: at(u.CPU), GPU: at(u.GPU), CPUAlone: at(u.CPUAlone), GPUAlone: at(u.GPUAlone),
			CPUPacked: at(u.CPUPacked), CPUPackedAlone: at(u.CPUPackedAlone), CPUShare: at(u.CPUShare),
			CPUPerPos: at(u.CPUPerPos), GPUPerPos: at(u.GPUPerPos)}
		grow := func(v []float64, perPos []float64) {
			if len(v) == 1 && len(perPos) == 1 {
				v[0] = max(v[0]+float64(rows)*float64(depth)*perPos[0], v[0]/2)
			}
		}
		grow(t.CPU, t.CPUPerPos)
		grow(t.CPUAlone, t.CPUPerPos)
		grow(t.CPUPacked, t.CPUPerPos)
		grow(t.CPUPackedAlone, t.CPUPerPos)
		grow(t.GPU, t.GPUPerPos)
		grow(t.GPUAlone, t.GPUPerPos)
		q.Units[i] = t
	}
	return &q
}

// AtDepth is the profile of batches whose rows each have depth positions
// of context before them (the same batches, each as Shaped makes it: a
// decode row depth-DecodePos beyond the profile's own, a prefill row
// depth). p is not changed; without per-position figures it is returned.
func (p *Profile) AtDepth(depth int) *Profile {
	if depth <= 0 || p.DepthPos == 0 {
		return p
	}
	q := *p
	q.Units = make([]UnitTimes, len(p.Units))
	for i, u := range p.Units {
		q.Units[i] = u
		for _, f := range []*[]float64{&q.Units[i].CPU, &q.Units[i].GPU, &q.Units[i].CPUAlone, &q.Units[i].GPUAlone, &q.Units[i].CPUPacked, &q.Units[i].CPUPackedAlone} {
			*f = slices.Clone(*f)
		}
	}
	for b, n := range p.Batches {
		extra := depth
		if n == 1 {
			extra = depth - p.DecodePos
		}
		s := p.Shaped(n, extra)
		for i := range q.Units {
			t, at := &q.Units[i], s.Units[i]
			set := func(dst, src []float64) {
				if len(dst) == len(p.Batches) && len(src) == 1 {
					dst[b] = src[0]
				}
			}
			set(t.CPU, at.CPU)
			set(t.GPU, at.GPU)
			set(t.CPUAlone, at.CPUAlone)
			set(t.GPUAlone, at.GPUAlone)
			set(t.CPUPacked, at.CPUPacked)
			set(t.CPUPackedAlone, at.CPUPackedAlone)
		}
	}
	return &q
}

// BatchIndex is the index of the profiled batch size closest to n (on a
// log scale).
func (p *Profile) BatchIndex(n int) int {
	best, bestD := 0, 0.0
	for i, b := range p.Batches {
		d := float64(b) / float64(max(n, 1))
		if d < 1 {
			d = 1 / d
		}
		if i == 0 || d < bestD {
			best, bestD = i, d
		}
	}
	return best
}

// CacheDir is where profiles are kept: $ATS_CACHE_DIR, else ats/profiles
// under the user's cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv("ATS_CACHE_DIR"); d != "" {
		return filepath.Join(d, "profiles"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("plan: no cache directory: %w", err)
	}
	return filepath.Join(d, "ats", "profiles"), nil
}

// LoadProfile reads the cached profile of key from dir; (nil, nil) when
// there is none or it is of another version.
func LoadProfile(dir, key string) (*Profile, error) {
	b, err := os.ReadFile(filepath.Join(dir, key+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("plan: cached profile %s: %w", key, err)
	}
	if p.Version != ProfileVersion || p.Key != key {
		return nil, nil
	}
	return &p, nil
}

// SaveProfile writes p to dir (atomically: a reader never sees half).
func SaveProfile(dir string, p *Profile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, p.Key+".*.tmp")
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("plan: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plan: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, p.Key+".json")); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}
