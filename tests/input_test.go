package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunInputEndToEnd: real `lakeshore dev` and a real nymph. A run
// whose listed jobs carry their own input (one takes the run's default)
// runs bodies that copy $NYMPH_INPUT_FILE to $NYMPH_RESULT_FILE: each
// job's result is its input.
func TestRunInputEndToEnd(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0])
	op := d.Operator()
	ctx := context.Background()
	startNymph(t, d, "input", "--capacity", "2")

	req := wire.RunRequest{Queue: "q", Name: "input",
		Argv:  []string{"/bin/sh", "-c", `cp "$NYMPH_INPUT_FILE" "$NYMPH_RESULT_FILE"`},
		Input: json.RawMessage(`{"default": true}`),
		Jobs: []wire.RunJob{
			{Input: json.RawMessage(`{"prompt": "first", "n": [1, 2]}`)},
			{},
			{Input: json.RawMessage(`"third"`)},
		}}
	var created wire.RunCreated
	if status, err := op.Do(ctx, "submit run", http.MethodPost, "/v1/runs", nil, req, &created); err != nil || status != http.StatusCreated {
		t.Fatalf("submit run: %d %v", status, err)
	}
	waittest.UntilState(t, 2*time.Minute, "the run done", func() (bool, string) {
		var run wire.Run
		if _, err := op.Do(ctx, "get run", http.MethodGet, "/v1/runs/"+created.RunID, nil, nil, &run); err != nil {
			return false, err.Error()
		}
		return run.State == wire.RunDone, run.State
	})
	want := []string{`{"prompt":"first","n":[1,2]}`, `{"default":true}`, `"third"`}
	results := runResults(t, d, created.RunID)
	if len(results) != len(want) {
		t.Fatalf("%d result lines, want %d", len(results), len(want))
	}
	for i, r := range results {
		if r.State != wire.StateSucceeded || string(r.Result) != want[i] {
			t.Errorf("job %d: %s with result %s, want succeeded with its input %s", i, r.State, r.Result, want[i])
		}
	}
}
