package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRunInputReachesTheRunCommand: a matrix run's run-level input and a
// listed run's per-job inputs (a job without its own takes the run's)
// reach the run command a worker claims, and the operator's view of each
// job shows its input as sent.
func TestRunInputReachesTheRunCommand(t *testing.T) {
	h := newHarness(t)
	matrix := wire.RunRequest{Queue: "q", Argv: []string{"eval", "{model}"},
		Matrix: map[string][]string{"model": {"a", "b"}}, Input: json.RawMessage(`{"prompt": "hi"}`)}
	listed := wire.RunRequest{Queue: "q", Argv: []string{"true"}, Input: json.RawMessage(`"default"`),
		Jobs: []wire.RunJob{{Input: json.RawMessage(`[1, 2]`)}, {}, {Input: json.RawMessage(`{"n":3}`)}}}
	want := map[string]string{} // run id/index -> input
	for _, req := range []struct {
		wire.RunRequest
		inputs []string
	}{{matrix, []string{`{"prompt":"hi"}`, `{"prompt":"hi"}`}}, {listed, []string{`[1,2]`, `"default"`, `{"n":3}`}}} {
		var created wire.RunCreated
		h.do(http.MethodPost, "/v1/runs", operatorToken, req.RunRequest).want(t, http.StatusCreated, &created)
		for i, in := range req.inputs {
			want[created.RunID+"/"+string(rune('0'+i))] = in
		}
	}

	w := h.helloReq(wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"}})
	capacity, running := 1, 0
	one := wire.Capabilities{MaxConcurrency: &capacity, CurrentInvocations: &running}
	got := map[string]string{}
	for range 10 {
		cmds := h.poll(w, wire.PollRequest{Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: &one})
		if len(cmds) == 0 {
			break
		}
		run := cmds[0].Invocation
		key := run.Env["LAKESHORE_RUN_ID"] + "/" + run.Env["LAKESHORE_RUN_INDEX"]
		got[key] = string(run.Input)
		if view := h.invocation(run.InvocationID); string(view.Input) != want[key] {
			t.Errorf("job %s: the operator's view shows input %s, want %s", key, view.Input, want[key])
		}
		code := 0
		h.ack(w, wire.AckRequest{InvocationID: run.InvocationID, Attempt: run.Attempt, State: wire.StateSucceeded, ExitCode: &code})
	}
	if len(got) != len(want) {
		t.Fatalf("claimed %d jobs (%v), want %d", len(got), got, len(want))
	}
	for k, in := range want {
		if got[k] != in {
			t.Errorf("job %s: run command carries input %q, want %q", k, got[k], in)
		}
	}
}

// TestSubmitInput: a submit's input reaches the run command and the
// operator's view; one without input carries none; a bad one is a 400.
func TestSubmitInput(t *testing.T) {
	h := newHarness(t)
	with := h.submitReq(wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, Input: json.RawMessage(`{"k": [true]}`)})
	if string(with.Input) != `{"k":[true]}` {
		t.Fatalf("submit answered input %s", with.Input)
	}
	without := h.submitReq(wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	w := h.helloReq(wire.HelloRequest{MachineID: "m1", BootID: "b1", Lanes: []string{"q"}})
	capacity, running := 2, 0
	two := wire.Capabilities{MaxConcurrency: &capacity, CurrentInvocations: &running}
	cmds := h.poll(w, wire.PollRequest{Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}, UpdatedCapabilities: &two})
	inputs := map[string]string{}
	for _, c := range ofType(cmds, "run") {
		inputs[c.Invocation.InvocationID] = string(c.Invocation.Input)
	}
	if inputs[with.InvocationID] != `{"k":[true]}` || inputs[without.InvocationID] != "" || len(inputs) != 2 {
		t.Fatalf("run commands' inputs %v", inputs)
	}
	if v := h.invocation(with.InvocationID); string(v.Input) != `{"k":[true]}` {
		t.Fatalf("the operator's view shows input %s", v.Input)
	}
	h.unchanged(t, func() {
		body := `{"queue":"q","argv":["true"],"input":"` + strings.Repeat("x", wire.MaxInputBytes) + `"}`
		h.do(http.MethodPost, "/v1/invocations", operatorToken, body).wantError(t, http.StatusRequestEntityTooLarge, wire.CodeTooLarge)
	})
}
