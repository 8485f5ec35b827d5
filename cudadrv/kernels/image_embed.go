//go:build !atsfatbindir

package kernels

import (
	"embed"
	"io/fs"
)

//go:embed fatbin/*.fatbin fatbin/*.manifest
var embedded embed.FS

// imageFS holds fatbin/<name>.fatbin and .manifest: in the binary.
func imageFS() fs.FS { return embedded }
