package lifecycle

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/pythontest"
)

// TestPython runs the Python library's tests (python/tests), so go test
// covers both halves of the contract. It skips when python3 is not on PATH,
// except in CI (CI=true), where that fails.
func TestPython(t *testing.T) {
	// The tests set NYMPH_LIFECYCLE_URL themselves; one inherited from a
	// nymph run must not leak in.
	pythontest.Run(t, filepath.Join("..", "..", "python"), 60*time.Second, []string{EnvURL + "="},
		"-m", "unittest", "discover", "-s", "tests", "-t", ".")
}
