//go:build !unix && !windows

package hub

import "os"

// tryLock: no file locks here; concurrent pulls are not kept apart.
func tryLock(*os.File) error { return nil }

func unlockFile(*os.File) {}
