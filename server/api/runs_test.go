package api_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// runLines reads every page of a run's results (records or not).
func (h *harness) runLines(t *testing.T, id string, records bool) []map[string]json.RawMessage {
	t.Helper()
	var out []map[string]json.RawMessage
	next := "0"
	for pages := 0; next != ""; pages++ {
		if pages > 100 {
			t.Fatal("results never ended")
		}
		r := h.do(http.MethodGet, fmt.Sprintf("/v1/runs/%s/results?from=%s&records=%v&limit=3", id, next, records), operatorToken, nil)
		if r.status != http.StatusOK {
			t.Fatalf("results: %d %s", r.status, r.body)
		}
		sc := bufio.NewScanner(bytes.NewReader(r.body))
		for sc.Scan() {
			var line map[string]json.RawMessage
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("results line %q: %v", sc.Text(), err)
			}
			out = append(out, line)
		}
		next = r.header.Get(wire.NextIndexHeader)
	}
	return out
}

// TestRunCapstone is the seed's run at the router: a matrix of models ×
// epochs makes 4 jobs of 3 vignette records each; one worker dies holding
// a job (its bye hands it back), a second worker runs every job, and the
// first worker's late ack of its attempt is refused. The run ends done with
// done_count 4 and exactly 12 records, each (model, epoch, vignette) once.
func TestRunCapstone(t *testing.T) {
	h := newHarness(t)
	req := wire.RunRequest{Queue: "q", Argv: []string{"eval", "--model={model}", "--epoch", "{epoch}"},
		Matrix: map[string][]string{"model": {"claude", "gpt"}, "epoch": {"1", "2"}}, IdempotencyKey: "k1"}
	var created wire.RunCreated
	h.do(http.MethodPost, "/v1/runs", operatorToken, req).want(t, http.StatusCreated, &created)
	if created.Total != 4 || created.State != wire.RunRunning {
		t.Fatalf("created %+v, want 4 jobs running", created)
	}
	var replay wire.RunCreated
	h.do(http.MethodPost, "/v1/runs", operatorToken, req).want(t, http.StatusOK, &replay)
	if replay.RunID != created.RunID {
		t.Fatalf("a replay made run %s, want %s", replay.RunID, created.RunID)
	}
	other := req
	other.Name = "another"
	h.do(http.MethodPost, "/v1/runs", operatorToken, other).wantError(t, http.StatusConflict, wire.CodeConflict)

	dying := h.helloReq(wire.HelloRequest{MachineID: "m-dying", BootID: "b1", Lanes: []string{"q"}})
	steady := h.helloReq(wire.HelloRequest{MachineID: "m-steady", BootID: "b1", Lanes: []string{"q"}})
	capacity, running := 1, 0
	one := wire.Capabilities{MaxConcurrency: &capacity, CurrentInvocations: &running}
	cmds := h.poll(dying, wire.PollRequest{Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: &one})
	if len(cmds) != 1 || cmds[0].Invocation == nil {
		t.Fatalf("the dying worker's poll: %+v", cmds)
	}
	lost := cmds[0].Invocation
	h.bye(dying, wire.ByeSignal)

	seen := map[string]bool{}
	for range 10 {
		cmds := h.poll(steady, wire.PollRequest{Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: &one})
		if len(cmds) == 0 {
			break
		}
		run := cmds[0].Invocation
		env := run.Env
		model, epoch := env["LAKESHORE_MATRIX_MODEL"], env["LAKESHORE_MATRIX_EPOCH"]
		if env["LAKESHORE_RUN_ID"] != created.RunID || env["LAKESHORE_RUN_INDEX"] == "" ||
			!slices.Equal(run.Argv, []string{"eval", "--model=" + model, "--epoch", epoch}) {
			t.Fatalf("job %s: argv %v env %v", run.InvocationID, run.Argv, env)
		}
		var recs []string
		for _, v := range []string{"a", "b", "c"} {
			recs = append(recs, fmt.Sprintf(`{"model":%q,"epoch":%q,"vignette":%q}`, model, epoch, v))
		}
		code := 0
		h.ack(steady, wire.AckRequest{InvocationID: run.InvocationID, Attempt: run.Attempt, State: wire.StateSucceeded,
			ExitCode: &code, ResultBlob: json.RawMessage("[" + strings.Join(recs, ",") + "]")})
		seen[run.InvocationID] = true
	}
	if len(seen) != 4 || !seen[lost.InvocationID] {
		t.Fatalf("the steady worker ran %d jobs (%v), want all 4 with the lost one", len(seen), seen)
	}
	code := 0
	late := h.ack(dying, wire.AckRequest{InvocationID: lost.InvocationID, Attempt: lost.Attempt, State: wire.StateSucceeded,
		ExitCode: &code, ResultBlob: json.RawMessage(`[{"stale":true}]`)})
	if late.Recorded {
		t.Fatalf("the dead worker's late ack counted: %+v", late)
	}

	var got wire.Run
	h.do(http.MethodGet, "/v1/runs/"+created.RunID, operatorToken, nil).want(t, http.StatusOK, &got)
	if got.State != wire.RunDone || got.DoneCount != 4 || got.Counts[wire.StateSucceeded] != 4 || got.Total != 4 {
		t.Fatalf("run %+v, want done with done_count 4", got)
	}
	lines := h.runLines(t, created.RunID, false)
	if len(lines) != 4 {
		t.Fatalf("%d result lines, want 4", len(lines))
	}
	for i, l := range lines {
		if string(l["index"]) != fmt.Sprint(i) || string(l["state"]) != `"succeeded"` {
			t.Errorf("result line %d: %s", i, l)
		}
	}
	records := h.runLines(t, created.RunID, true)
	keys := map[string]int{}
	for _, l := range records {
		keys[string(l["record"])]++
	}
	if len(records) != 12 || len(keys) != 12 {
		t.Fatalf("%d records (%d distinct), want 12 distinct: %v", len(records), len(keys), keys)
	}
	var list wire.RunList
	h.do(http.MethodGet, "/v1/runs?queue=q", operatorToken, nil).want(t, http.StatusOK, &list)
	if len(list.Runs) != 1 || list.Runs[0].RunID != created.RunID {
		t.Fatalf("runs of q: %+v", list)
	}
}

// TestRunBadInput: a run that cannot be made is refused with a clear 4xx
// and writes nothing.
func TestRunBadInput(t *testing.T) {
	h := newHarness(t)
	many := make([]wire.RunJob, wire.MaxRunJobs+1)
	for _, c := range []struct {
		name string
		body any
		want string
	}{
		{"no jobs", wire.RunRequest{Queue: "q", Argv: []string{"true"}}, "needs jobs"},
		{"empty jobs", wire.RunRequest{Queue: "q", Argv: []string{"true"}, Jobs: []wire.RunJob{}}, "needs jobs"},
		{"both", wire.RunRequest{Queue: "q", Argv: []string{"true"}, Jobs: []wire.RunJob{{}},
			Matrix: map[string][]string{"a": {"1"}}}, "not both"},
		{"past the limit", wire.RunRequest{Queue: "q", Argv: []string{"true"}, Jobs: many}, "at most"},
		{"matrix past the limit", wire.RunRequest{Queue: "q", Argv: []string{"true"},
			Matrix: map[string][]string{"a": seq(101), "b": seq(100)}}, "more than"},
		{"axis without values", wire.RunRequest{Queue: "q", Argv: []string{"true"}, Matrix: map[string][]string{"a": {}}}, "no values"},
		{"axis twice", `{"queue":"q","argv":["true"],"matrix":{"model":["a"],"model":["b"]}}`, "repeats"},
		{"axis twice in two cases", `{"queue":"q","argv":["true"],"matrix":{"model":["a"],"MODEL":["b"]}}`, "same axis"},
		{"bad axis name", wire.RunRequest{Queue: "q", Argv: []string{"true"}, Matrix: map[string][]string{"9x": {"1"}}}, "axis"},
		{"placeholder of no axis", wire.RunRequest{Queue: "q", Argv: []string{"echo", "{modle}"},
			Matrix: map[string][]string{"model": {"a"}}}, "{modle}"},
		{"a job failing its own check", wire.RunRequest{Queue: "q", Argv: []string{"true"},
			Jobs: []wire.RunJob{{}, {TimeoutS: -1}}}, "jobs[1]"},
		{"a job without argv", wire.RunRequest{Queue: "q", Jobs: []wire.RunJob{{Argv: []string{"true"}}, {}}}, "jobs[1]"},
		{"bad queue", wire.RunRequest{Queue: "../x", Argv: []string{"true"}, Jobs: []wire.RunJob{{}}}, "queue"},
		{"a job's input past the limit", wire.RunRequest{Queue: "q", Argv: []string{"true"},
			Jobs: []wire.RunJob{{}, {Input: bigInput}}}, "jobs[1]: input is 262146 bytes"},
		{"the run's input past the limit", wire.RunRequest{Queue: "q", Argv: []string{"true"},
			Jobs: []wire.RunJob{{}}, Input: bigInput}, "input is 262146 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h.unchanged(t, func() {
				e := h.do(http.MethodPost, "/v1/runs", operatorToken, c.body).wantError(t, http.StatusBadRequest, wire.CodeInvalid)
				if !strings.Contains(e.Message, c.want) {
					t.Errorf("message %q does not say %q", e.Message, c.want)
				}
			})
		})
	}
}

// bigInput is a JSON string 2 bytes past wire.MaxInputBytes.
var bigInput = json.RawMessage(`"` + strings.Repeat("x", wire.MaxInputBytes) + `"`)

func seq(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}

// TestRunRetryFailed: POST /v1/runs/{id}/retry {"failed": true} queues the
// failed job again; its failure leaves the run's counts, a second retry
// queues nothing, and the job's new success is counted once, its result
// line naming the new attempt.
func TestRunRetryFailed(t *testing.T) {
	h := newHarness(t)
	var created wire.RunCreated
	h.do(http.MethodPost, "/v1/runs", operatorToken, wire.RunRequest{Queue: "q", Argv: []string{"eval"},
		Jobs: []wire.RunJob{{}, {}, {}}}).want(t, http.StatusCreated, &created)
	w := h.helloReq(wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"}})
	capacity, running := 1, 0
	one := wire.Capabilities{MaxConcurrency: &capacity, CurrentInvocations: &running}
	runOne := func(code int) wire.RunInvocation {
		t.Helper()
		cmds := h.poll(w, wire.PollRequest{Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: &one})
		if len(cmds) != 1 || cmds[0].Invocation == nil {
			t.Fatalf("poll: %+v, want one run", cmds)
		}
		inv := *cmds[0].Invocation
		state := wire.StateSucceeded
		req := wire.AckRequest{InvocationID: inv.InvocationID, Attempt: inv.Attempt, State: state, ExitCode: &code}
		if code != 0 {
			req.State = wire.StateFailed
			req.Error = &wire.ErrorInfo{Type: wire.ErrorTypeExitCode, Message: "exited 1"}
		}
		h.ack(w, req)
		return inv
	}
	failed := runOne(1)
	runOne(0)
	runOne(0)
	var got wire.Run
	h.do(http.MethodGet, "/v1/runs/"+created.RunID, operatorToken, nil).want(t, http.StatusOK, &got)
	if got.State != wire.RunDone || got.Counts[wire.StateFailed] != 1 || got.DoneCount != 3 {
		t.Fatalf("before the retry: %+v", got)
	}
	h.do(http.MethodPost, "/v1/runs/"+created.RunID+"/retry", operatorToken, map[string]bool{"failed": false}).
		wantError(t, http.StatusBadRequest, wire.CodeInvalid)
	var retried wire.RunRetried
	h.do(http.MethodPost, "/v1/runs/"+created.RunID+"/retry", operatorToken, map[string]bool{"failed": true}).
		want(t, http.StatusAccepted, &retried)
	if retried.Retried != 1 || retried.Remaining != 0 {
		t.Fatalf("retry: %+v, want 1 job queued again", retried)
	}
	h.do(http.MethodPost, "/v1/runs/"+created.RunID+"/retry", operatorToken, map[string]bool{"failed": true}).
		want(t, http.StatusAccepted, &retried)
	if retried.Retried != 0 {
		t.Fatalf("a second retry queued %d jobs again, want 0", retried.Retried)
	}
	h.do(http.MethodGet, "/v1/runs/"+created.RunID, operatorToken, nil).want(t, http.StatusOK, &got)
	if got.State != wire.RunRunning || got.Counts[wire.StateFailed] != 0 || got.Counts[wire.StateQueued] != 1 || got.DoneCount != 2 {
		t.Fatalf("after the retry: %+v, want running with the job queued and no failure counted", got)
	}
	again := runOne(0)
	if again.InvocationID != failed.InvocationID || again.Attempt != 2 {
		t.Fatalf("the retried job ran as %s attempt %d, want %s attempt 2", again.InvocationID, again.Attempt, failed.InvocationID)
	}
	h.do(http.MethodGet, "/v1/runs/"+created.RunID, operatorToken, nil).want(t, http.StatusOK, &got)
	if got.State != wire.RunDone || got.Counts[wire.StateSucceeded] != 3 || got.DoneCount != 3 || got.Counts[wire.StateFailed] != 0 {
		t.Fatalf("after the rerun: %+v, want done with 3 succeeded", got)
	}
	for _, l := range h.runLines(t, created.RunID, false) {
		if string(l["invocation_id"]) == fmt.Sprintf("%q", failed.InvocationID) && (string(l["attempt"]) != "2" || string(l["state"]) != `"succeeded"`) {
			t.Errorf("the rerun job's line: %s, want attempt 2 succeeded", l)
		}
	}
}

// TestRunsNewestFirst: GET /v1/runs lists runs newest first, and ?queue=
// only that queue's.
func TestRunsNewestFirst(t *testing.T) {
	h := newHarness(t)
	var made []string
	for _, q := range []string{"a", "b", "a"} {
		var c wire.RunCreated
		h.do(http.MethodPost, "/v1/runs", operatorToken, wire.RunRequest{Queue: q, Argv: []string{"true"},
			Jobs: []wire.RunJob{{}}}).want(t, http.StatusCreated, &c)
		made = append(made, c.RunID)
	}
	var all, ofA wire.RunList
	h.do(http.MethodGet, "/v1/runs", operatorToken, nil).want(t, http.StatusOK, &all)
	h.do(http.MethodGet, "/v1/runs?queue=a", operatorToken, nil).want(t, http.StatusOK, &ofA)
	ids := func(l wire.RunList) []string {
		var out []string
		for _, r := range l.Runs {
			out = append(out, r.RunID)
		}
		return out
	}
	if got, want := ids(all), []string{made[2], made[1], made[0]}; !slices.Equal(got, want) {
		t.Errorf("GET /v1/runs = %v, want newest first %v", got, want)
	}
	if got, want := ids(ofA), []string{made[2], made[0]}; !slices.Equal(got, want) {
		t.Errorf("GET /v1/runs?queue=a = %v, want %v", got, want)
	}
}
