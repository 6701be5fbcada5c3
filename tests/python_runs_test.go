package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestPythonClientRuns runs the Python client's live tests
// (python/livetests) against a real `lakeshore dev` on the embedded store
// and a real nymph serving queue q: a 2×2 matrix run waited for and read
// (by job, page by page, and as records), a cancel on a queue nobody
// serves, a replayed idempotency key, a submit whose answer a proxy loses,
// and a bad request. It skips when python3 is not on PATH, except in CI.
func TestPythonClientRuns(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 is not on PATH: CI runs the Python client's tests")
		}
		t.Skip("python3 not on PATH: the Python client's tests need it")
	}
	dir, err := filepath.Abs(filepath.Join("..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	d := startDev(t, backends[0])
	startNymph(t, d, "py-runs", "--capacity", "2")

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", "livetests.test_runs")
	cmd.Dir = dir
	// PYTHONDONTWRITEBYTECODE: no __pycache__ left in the tree.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1",
		"LAKESHORE_URL="+d.URL, "LAKESHORE_TOKEN="+d.OperatorToken,
		"LAKESHORE_TEST_QUEUE=q", "LAKESHORE_TEST_IDLE_QUEUE=py-idle")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python live tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
