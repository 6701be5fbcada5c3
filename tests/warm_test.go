package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/pythontest"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestWarmPythonPlain: real `lakeshore dev` and a real nymph run three
// jobs of examples/warm/plain.py, each with its own input (one with none).
// dls.serve() runs the example's on_host_setup hook (its "model") and
// on_run_setup hook before the body, and each job's result is its input
// echoed with the model that answered it. It skips when python3 is not on
// PATH, except in CI.
func TestWarmPythonPlain(t *testing.T) {
	t.Parallel()
	pythontest.Python3(t)
	d := startDev(t, backends[0])
	startNymph(t, d, "warm", "--capacity", "3")
	script, err := filepath.Abs("../examples/warm/plain.py")
	if err != nil {
		t.Fatal(err)
	}
	pythonPath, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []json.RawMessage{json.RawMessage(`{"prompt":"first","n":[1,2]}`), nil, json.RawMessage(`"third"`)}
	req := wire.RunRequest{Queue: "q", Name: "warm",
		Argv: []string{"python3", script},
		Env:  map[string]string{"PYTHONPATH": pythonPath, "PYTHONDONTWRITEBYTECODE": "1"}}
	for _, in := range inputs {
		req.Jobs = append(req.Jobs, wire.RunJob{Input: in})
	}
	results := runToEnd(t, d, req, time.Minute)
	if len(results) != len(inputs) {
		t.Fatalf("%d result lines, want %d", len(results), len(inputs))
	}
	model := map[string]any{"name": "echo-1", "loads": 1.0}
	for i, r := range results {
		var got map[string]any
		if err := json.Unmarshal(r.Result, &got); err != nil || r.State != wire.StateSucceeded {
			t.Errorf("job %d: %s with result %s (%v); want succeeded with a JSON object", i, r.State, r.Result, err)
			continue
		}
		var in any // nil for the job without input: the body's None
		if inputs[i] != nil {
			if err := json.Unmarshal(inputs[i], &in); err != nil {
				t.Fatal(err)
			}
		}
		want := map[string]any{"input": in, "model": model, "scratch": true}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("job %d: result %s, want %v", i, r.Result, want)
		}
	}
}

// runToEnd submits req as the operator, waits (up to bound) for the run to
// be done and returns its result lines.
func runToEnd(t *testing.T, d *devServer, req wire.RunRequest, bound time.Duration) []wire.RunResult {
	t.Helper()
	op := d.Operator()
	ctx := context.Background()
	var created wire.RunCreated
	if status, err := op.Do(ctx, "submit run", http.MethodPost, "/v1/runs", nil, req, &created); err != nil || status != http.StatusCreated {
		t.Fatalf("submit run: %d %v", status, err)
	}
	waittest.UntilState(t, bound, "the run done", func() (bool, string) {
		var run wire.Run
		if _, err := op.Do(ctx, "get run", http.MethodGet, "/v1/runs/"+created.RunID, nil, nil, &run); err != nil {
			return false, err.Error()
		}
		return run.State == wire.RunDone, run.State
	})
	return runResults(t, d, created.RunID)
}
