package api_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestOldFormatDaemon: a daemon of the seed's wire (docs/operations.md,
// "Upgrades"), whose hello and poll carry none of the later fields (no
// phase, no host_key, no invocations, no capabilities), still works
// against this control plane: its poll is a heartbeat that claims work,
// its ack records the outcome, and its bye ends it; the JSON it gets back
// has the fields it knows.
func TestOldFormatDaemon(t *testing.T) {
	h := newHarness(t)
	inv := h.submit("echo", "hi")
	var hello wire.HelloResponse
	h.do("POST", "/v1/daemon/hello", enrollToken, `{"machine_id": "old-host", "boot_id": "b1", "lanes": ["default"]}`).want(t, 200, &hello)
	poll := fmt.Sprintf(`{"worker_id": %q, "queue": "default"}`, hello.WorkerID)
	var resp struct {
		Commands []map[string]json.RawMessage `json:"commands"`
	}
	h.do("POST", "/v1/daemon/poll", hello.Token, poll).want(t, 200, &resp)
	if len(resp.Commands) != 1 || string(resp.Commands[0]["type"]) != `"run"` {
		t.Fatalf("an old-format poll got %+v, want one run command", resp.Commands)
	}
	var run wire.RunInvocation
	if err := json.Unmarshal(resp.Commands[0]["invocation"], &run); err != nil || run.InvocationID != inv.InvocationID || run.Attempt != 1 {
		t.Fatalf("the run command's invocation: %+v %v", run, err)
	}
	// A second old-format poll (no invocations list) hands nothing back.
	h.do("POST", "/v1/daemon/poll", hello.Token, poll).want(t, 200, &resp)
	if got := h.invocation(inv.InvocationID); got.State != wire.StateRunning || got.Attempt != 1 {
		t.Fatalf("after a poll without an invocations list: %s attempt %d, want running attempt 1", got.State, got.Attempt)
	}
	var ack wire.AckResponse
	h.do("POST", "/v1/daemon/ack", hello.Token, fmt.Sprintf(`{"worker_id": %q, "invocation_id": %q, "attempt": 1, "state": "succeeded", "result_blob": {"ok": true}}`,
		hello.WorkerID, inv.InvocationID)).want(t, 200, &ack)
	if !ack.Recorded || ack.State != wire.StateSucceeded {
		t.Fatalf("old-format ack: %+v", ack)
	}
	h.do("POST", "/v1/daemon/bye", hello.Token, fmt.Sprintf(`{"worker_id": %q, "reason": "signal", "inflight_abandoned": 0}`, hello.WorkerID)).want(t, 204, nil)
	if w := h.worker(hello.WorkerID); w.State != "gone" {
		t.Errorf("after bye the old daemon's worker reads %s", w.State)
	}
}
