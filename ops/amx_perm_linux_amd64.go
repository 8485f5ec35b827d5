//go:build !noasm

package ops

import "syscall"

// amxPermission asks Linux for the AMX tile data state of the process
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, since Linux 5.16):
// until granted, a tile instruction faults.
func amxPermission() bool {
	const archReqXcompPerm, xfeatureXtiledata = 0x1023, 18
	_, _, errno := syscall.RawSyscall(syscall.SYS_ARCH_PRCTL, archReqXcompPerm, xfeatureXtiledata, 0)
	return errno == 0
}
