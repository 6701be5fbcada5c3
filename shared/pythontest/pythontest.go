// Package pythontest runs the Python library's unittest suites (python/)
// from go test, so go test covers both halves of a contract. Tests only.
package pythontest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Run runs `python3 args...` in the repository's python/ directory (rel is
// its path from the calling package, e.g. "../python") with that directory
// on PYTHONPATH and env added, and fails t with the output when it fails
// or outlives timeout. It skips t when python3 is not on PATH, except in
// CI (CI=true), where that fails.
func Run(t testing.TB, rel string, timeout time.Duration, env []string, args ...string) {
	t.Helper()
	py := Python3(t)
	dir, err := filepath.Abs(rel)
	if err != nil {
		t.Fatalf("python dir: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = dir
	// PYTHONDONTWRITEBYTECODE: no __pycache__ left in the tree.
	cmd.Env = append(append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 %v: %v\n%s", args, err, out)
	}
	t.Logf("%s", out)
}

// Python3 reports python3's path. It skips t when python3 is not on PATH,
// except in CI (CI=true), where that fails: a test that starts servers for
// the Python tests calls it first.
func Python3(t testing.TB) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is not on PATH: CI runs the Python library's tests")
		}
		t.Skip("python3 not on PATH: the Python library's tests need it")
	}
	return py
}
