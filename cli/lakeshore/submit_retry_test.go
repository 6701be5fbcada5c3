package main

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestSubmitRefusesAttemptsAndBackoffItCannotKeep: a max_attempts or a
// retry backoff out of range is refused — by the control plane (400,
// naming the field and its range) or, for a 0 the request cannot carry,
// by the CLI in the same words — and nothing is queued; values in range
// are stored as given.
func TestSubmitRefusesAttemptsAndBackoffItCannotKeep(t *testing.T) {
	p := newTestPlane(t)
	ctx := t.Context()
	refused := []struct {
		name string
		args []string
		want string
	}{
		{"max-attempts 0", []string{"--max-attempts", "0"}, "max_attempts must be 1-20, got 0"},
		{"max-attempts 21", []string{"--max-attempts", "21"}, "max_attempts must be 1-20, got 21"},
		{"retry-backoff 0s", []string{"--retry-exit-code", "3", "--retry-backoff", "0s"}, "retry.backoff_s must be 1-900 seconds"},
		{"retry-backoff 1h", []string{"--retry-exit-code", "3", "--retry-backoff", "1h"}, "retry.backoff_s must be 1-900 seconds (15m0s, the longest wait before a retry), got 3600"},
	}
	for _, tc := range refused {
		args := append(append([]string{"submit"}, tc.args...), "--", "true")
		_, _, err := p.run(t, args...)
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("lakeshore %s: err = %v, want invalid holding %q", strings.Join(args, " "), err, tc.want)
		}
	}

	// The control plane refuses a 0 sent explicitly, whoever sends it.
	for _, body := range []map[string]any{
		{"queue": "default", "argv": []string{"true"}, "max_attempts": 0},
		{"queue": "default", "argv": []string{"true"}, "retry": map[string]any{"exit_codes": []int{3}, "backoff_s": 0}},
	} {
		status, err := p.op.Do(ctx, "submit", http.MethodPost, "/v1/invocations", nil, body, nil)
		if status != http.StatusBadRequest || !errors.Is(err, wire.ErrInvalid) {
			t.Errorf("POST /v1/invocations %v: %d %v, want 400 invalid", body, status, err)
		}
	}
	list, err := p.op.ListInvocations(ctx, client.ListInvocationsParams{})
	if err != nil || len(list.Invocations) != 0 {
		t.Fatalf("after refusals: %d invocations (%v), want none queued", len(list.Invocations), err)
	}

	id := strings.TrimSpace(p.mustRun(t, "submit", "--max-attempts", "20", "--retry-exit-code", "3", "--retry-backoff", "15m", "--", "true"))
	inv, err := p.op.GetInvocation(ctx, id)
	if err != nil || inv.MaxAttempts != 20 || inv.Retry == nil || inv.Retry.BackoffS != 900 {
		t.Fatalf("submitted %+v (%v), want max_attempts 20 and backoff_s 900", inv, err)
	}
	id = strings.TrimSpace(p.mustRun(t, "submit", "--retry-exit-code", "3", "--", "true"))
	inv, err = p.op.GetInvocation(ctx, id)
	if err != nil || inv.MaxAttempts != wire.DefaultMaxAttempts || inv.Retry == nil || inv.Retry.BackoffS != wire.DefaultRetryBackoffS {
		t.Fatalf("submitted %+v (%v), want the defaults", inv, err)
	}
}
