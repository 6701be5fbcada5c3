package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestSubmitAttemptsAndBackoff pins how a submit's max_attempts and
// retry.backoff_s are read: left out, each takes its default (an older
// client sends neither); sent, each is taken as it is or refused with a
// message that names the field and its range — never changed in silence.
func TestSubmitAttemptsAndBackoff(t *testing.T) {
	retry := func(p map[string]any) string { return with(okSubmit, "retry", p) }
	cases := []struct {
		name string
		body string
		// refused is "" when the body is accepted, else words the refusal
		// must hold.
		refused     string
		maxAttempts int
		backoffS    int // 0: no retry policy
	}{
		{name: "both left out", body: js(okSubmit), maxAttempts: wire.DefaultMaxAttempts},
		{name: "max_attempts null", body: with(okSubmit, "max_attempts", nil), maxAttempts: wire.DefaultMaxAttempts},
		{name: "max_attempts 0", body: with(okSubmit, "max_attempts", 0), refused: "max_attempts must be 1-20, got 0"},
		{name: "MAX_ATTEMPTS 0 (field names match case-insensitively)",
			body: `{"queue":"default","argv":["true"],"MAX_ATTEMPTS":0}`, refused: "max_attempts must be 1-20, got 0"},
		{name: "max_attempts 1", body: with(okSubmit, "max_attempts", 1), maxAttempts: 1},
		{name: "max_attempts 20", body: with(okSubmit, "max_attempts", 20), maxAttempts: 20},
		{name: "max_attempts 21", body: with(okSubmit, "max_attempts", 21), refused: "max_attempts must be 1-20, got 21"},
		{name: "max_attempts -1", body: with(okSubmit, "max_attempts", -1), refused: "max_attempts must be 1-20, got -1"},
		{name: "backoff_s left out", body: retry(map[string]any{"exit_codes": []int{3}}),
			maxAttempts: wire.DefaultMaxAttempts, backoffS: wire.DefaultRetryBackoffS},
		{name: "backoff_s null", body: retry(map[string]any{"exit_codes": []int{3}, "backoff_s": nil}),
			maxAttempts: wire.DefaultMaxAttempts, backoffS: wire.DefaultRetryBackoffS},
		{name: "backoff_s 0", body: retry(map[string]any{"exit_codes": []int{3}, "backoff_s": 0}),
			refused: "retry.backoff_s must be 1-900 seconds (15m0s, the longest wait before a retry), got 0"},
		{name: "backoff_s 1", body: retry(map[string]any{"timeout": true, "backoff_s": 1}),
			maxAttempts: wire.DefaultMaxAttempts, backoffS: 1},
		{name: "backoff_s 900", body: retry(map[string]any{"timeout": true, "backoff_s": 900}),
			maxAttempts: wire.DefaultMaxAttempts, backoffS: 900},
		{name: "backoff_s 901", body: retry(map[string]any{"timeout": true, "backoff_s": 901}),
			refused: "retry.backoff_s must be 1-900 seconds"},
		{name: "backoff_s 3600 (an hour)", body: retry(map[string]any{"timeout": true, "backoff_s": 3600}),
			refused: "got 3600"},
		{name: "backoff_s -1", body: retry(map[string]any{"timeout": true, "backoff_s": -1}),
			refused: "got -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req wire.SubmitRequest
			err := wire.Decode(strings.NewReader(tc.body), &req)
			if tc.refused != "" {
				if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("Decode(%s) = %v, want invalid holding %q", tc.body, err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode(%s) = %v, want accepted", tc.body, err)
			}
			if req.MaxAttempts != tc.maxAttempts {
				t.Errorf("max_attempts = %d, want %d", req.MaxAttempts, tc.maxAttempts)
			}
			switch {
			case tc.backoffS == 0 && req.Retry != nil:
				t.Errorf("retry = %+v, want none", req.Retry)
			case tc.backoffS != 0 && (req.Retry == nil || req.Retry.BackoffS != tc.backoffS):
				t.Errorf("retry = %+v, want backoff_s %d", req.Retry, tc.backoffS)
			}
		})
	}
}
