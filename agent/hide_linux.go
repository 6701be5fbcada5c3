package agent

import "syscall"

// prSetDumpable is prctl's PR_SET_DUMPABLE (linux/prctl.h).
const prSetDumpable = 4

// HideFromSameUser marks the daemon not dumpable. Its /proc/<pid>/environ,
// mem and fds then belong to root, and ptrace needs root: a body running as
// the daemon's own user (no --run-as) cannot read the enrollment token from
// the daemon's environment or the worker token from its memory. It also
// means no core dumps of the daemon. Root bodies can read anything; that is
// what --run-as is for.
func HideFromSameUser() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
