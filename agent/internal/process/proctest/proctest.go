// Package proctest holds the helpers the process runner's tests and the
// agent's shutdown tests share: waiting for a pid file, for a process to be
// gone, for a child to exit without reaping it. Every wait is bounded by
// Wait; none decides how fast anything must be.
package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Wait bounds every wait. It is generous on purpose: the tests assert what
// happened, never how fast.
const Wait = 10 * time.Second

// WaitFile waits until path holds a line ending in a newline and reports
// it, trimmed.
func WaitFile(t testing.TB, path string) string {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		b, err := os.ReadFile(path)
		if err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %s (err %v)", path, Wait, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pid waits for the pid file at path (a body writes `echo $$ > pid`) and
// reports the pid in it.
func Pid(t testing.TB, path string) int {
	t.Helper()
	var pid int
	if _, err := fmt.Sscan(WaitFile(t, path), &pid); err != nil || pid <= 1 {
		t.Fatalf("pid file %s: %v (pid %d)", path, err, pid)
	}
	return pid
}

// Gone reports whether pid has exited. A zombie counts as gone: it runs
// nothing, and init in a container may never reap it.
func Gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	return len(fields) > 0 && (fields[0] == "Z" || fields[0] == "X")
}

// AssertGone fails the test (after killing it) unless pid is gone within
// Wait.
func AssertGone(t testing.TB, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for !Gone(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%s (pid %d) still running %s after the run ended", what, pid, Wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
