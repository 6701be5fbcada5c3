package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestNULRefused: exec cannot pass a NUL inside an argument or an
// environment value, so such a submit could only fail later on a worker.
func TestNULRefused(t *testing.T) {
	cases := map[string]SubmitRequest{
		"argv element": {Queue: "q", Argv: []string{"echo", "a\x00b"}},
		"env value":    {Queue: "q", Argv: []string{"true"}, Env: map[string]string{"K": "v\x00"}},
		"run env":      {Queue: "q", Argv: []string{"true"}, RunConfig: RunConfig{Env: map[string]string{"K": "\x00"}}},
		"setup argv":   {Queue: "q", Argv: []string{"true"}, RunConfig: RunConfig{RunSetup: []string{"make\x00"}}},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			if err := req.Validate(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want invalid", err)
			}
		})
	}
	if err := (&SetupRequest{Argv: []string{"sh", "-c", "\x00"}}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("setup argv with NUL: %v", err)
	}
}

// TestPollInvocationsNilVersusEmpty: an empty list is sent (it is
// authoritative: the worker runs nothing), a nil one is not (an old daemon).
func TestPollInvocationsNilVersusEmpty(t *testing.T) {
	empty, _ := json.Marshal(PollRequest{WorkerID: "w", Invocations: []string{}})
	absent, _ := json.Marshal(PollRequest{WorkerID: "w"})
	if !strings.Contains(string(empty), `"invocations":[]`) || strings.Contains(string(absent), "invocations") {
		t.Fatalf("empty: %s, absent: %s", empty, absent)
	}
	var back PollRequest
	if err := json.Unmarshal(empty, &back); err != nil || back.Invocations == nil {
		t.Fatalf("empty list decoded as nil: %v", err)
	}
}
