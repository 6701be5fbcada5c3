package tests

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunInputEndToEnd: real `lakeshore dev` and a real nymph. A run
// whose listed jobs carry their own input (one takes the run's default)
// runs bodies that copy $NYMPH_INPUT_FILE to $NYMPH_RESULT_FILE: each
// job's result is its input.
func TestRunInputEndToEnd(t *testing.T) {
	t.Parallel()
	d := startDev(t, backends[0])
	startNymph(t, d, "input", "--capacity", "2")

	req := wire.RunRequest{Queue: "q", Name: "input",
		Argv:  []string{"/bin/sh", "-c", `cp "$NYMPH_INPUT_FILE" "$NYMPH_RESULT_FILE"`},
		Input: json.RawMessage(`{"default": true}`),
		Jobs: []wire.RunJob{
			{Input: json.RawMessage(`{"prompt": "first", "n": [1, 2]}`)},
			{},
			{Input: json.RawMessage(`"third"`)},
		}}
	results := runToEnd(t, d, req, 2*time.Minute)
	want := []string{`{"prompt":"first","n":[1,2]}`, `{"default":true}`, `"third"`}
	if len(results) != len(want) {
		t.Fatalf("%d result lines, want %d", len(results), len(want))
	}
	for i, r := range results {
		if r.State != wire.StateSucceeded || string(r.Result) != want[i] {
			t.Errorf("job %d: %s with result %s, want succeeded with its input %s", i, r.State, r.Result, want[i])
		}
	}
}
