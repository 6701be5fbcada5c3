package tests

import (
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/pythontest"
)

// TestPythonClientRuns runs the Python client's live tests
// (python/livetests) against a real `lakeshore dev` on the embedded store
// and a real nymph serving queue q: a 2×2 matrix run waited for and read
// (by job, page by page, and as records), a cancel on a queue nobody
// serves, a replayed idempotency key, a submit whose answer a proxy loses,
// and a bad request. It skips when python3 is not on PATH, except in CI.
func TestPythonClientRuns(t *testing.T) {
	pythontest.Python3(t)
	d := startDev(t, backends[0])
	startNymph(t, d, "py-runs", "--capacity", "2")
	pythontest.Run(t, "../python", 5*time.Minute, []string{
		"LAKESHORE_URL=" + d.URL, "LAKESHORE_TOKEN=" + d.OperatorToken,
		"LAKESHORE_TEST_QUEUE=q", "LAKESHORE_TEST_IDLE_QUEUE=py-idle",
	}, "-m", "unittest", "-v", "livetests.test_runs")
}
