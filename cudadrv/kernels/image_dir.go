//go:build atsfatbindir

package kernels

import (
	"io/fs"
	"os"
)

// imageFS holds fatbin/<name>.fatbin and .manifest: with the build tag
// atsfatbindir, read from the folder $ATS_FATBIN_DIR (cudadrv/kernels of a
// checkout) instead of being embedded, which keeps test binaries carried
// to a GPU machine about 5 MB smaller each. Not for releases.
func imageFS() fs.FS {
	dir := os.Getenv("ATS_FATBIN_DIR")
	if dir == "" {
		dir = "ATS_FATBIN_DIR is not set (a build with the tag atsfatbindir reads its kernels from there)"
	}
	return os.DirFS(dir)
}
