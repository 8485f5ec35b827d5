//go:build !noasm && !linux

package ops

// amxPermission: only Linux's way of granting the tile state is
// implemented; elsewhere the VNNI kernels compute every product.
func amxPermission() bool { return false }
