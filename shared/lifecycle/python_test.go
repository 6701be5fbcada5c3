package lifecycle

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestPython runs the Python library's tests (python/tests), so go test
// covers both halves of the contract. It skips when python3 is not on PATH,
// except in CI (CI=true), where that fails.
func TestPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is not on PATH: CI runs the Python library's tests")
		}
		t.Skip("python3 not on PATH")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover",
		"-s", filepath.Join(dir, "tests"), "-t", dir)
	cmd.Dir = dir
	// PYTHONDONTWRITEBYTECODE: no __pycache__ left in the tree. The tests
	// set NYMPH_LIFECYCLE_URL themselves; one inherited from a nymph run
	// must not leak in.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1", EnvURL+"=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
