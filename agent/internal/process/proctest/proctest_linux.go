package proctest

import (
	"syscall"
	"unsafe"
)

// WaitExitedNoReap blocks until child pid of this process has exited,
// leaving it a zombie for its own Wait to reap (waitid WNOWAIT).
func WaitExitedNoReap(pid int) error {
	const pPID = 1 // idtype_t P_PID
	var info [128]byte
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return e
		}
	}
}
