package plan

import "sort"

// sortByDensity orders unit indices by descending density, ties by
// execution order so the result is stable.
func sortByDensity(idx []int, units []Unit) {
	sort.SliceStable(idx, func(a, b int) bool {
		return units[idx[a]].Density() > units[idx[b]].Density()
	})
}
