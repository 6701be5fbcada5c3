package tests

import (
	"context"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestRetryPolicy: with a retry policy a failing body runs again after its
// backoff, on a real nymph, in process and through the Lambda bootstraps
// (the reaper releases it): one that fails once then succeeds ends
// succeeded on attempt 2; one that always fails ends failed when its
// attempts are spent; each retried attempt shows in the history. Without a
// policy a failure is final at once.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b, "--stale-after", "4s")
		op := d.Operator()
		startNymph(t, d, "m-retry", "--capacity", "2")
		submit := func(script string, retry *wire.RetryPolicy) string {
			t.Helper()
			inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"/bin/sh", "-c", script},
				MaxAttempts: 3, Retry: retry})
			if err != nil {
				t.Fatal(err)
			}
			return inv.InvocationID
		}
		policy := &wire.RetryPolicy{ExitCodes: []int{3}, BackoffS: 1}
		flaky := submit(`[ "$NYMPH_ATTEMPT" -ge 2 ] || exit 3`, policy)
		broken := submit(`exit 3`, policy)
		plain := submit(`exit 3`, nil)

		got := waitTerminal(t, op, flaky, 90*time.Second)
		if got.State != wire.StateSucceeded || got.Attempt != 2 || len(got.Attempts) != 2 ||
			!got.Attempts[0].Retried || got.Attempts[0].Outcome != wire.StateFailed || !got.Attempts[1].Recorded {
			t.Errorf("flaky body: %s after %d attempts, history %+v; want succeeded on attempt 2 after one retry", got.State, got.Attempt, got.Attempts)
		}
		got = waitTerminal(t, op, broken, 90*time.Second)
		if got.State != wire.StateFailed || got.Attempt != 3 || !got.Attempts[0].Retried || !got.Attempts[1].Retried ||
			!got.Attempts[2].Recorded || got.ExitCode == nil || *got.ExitCode != 3 {
			t.Errorf("broken body: %s after %d attempts, history %+v; want failed with exit 3 after two retries", got.State, got.Attempt, got.Attempts)
		}
		got = waitTerminal(t, op, plain, 30*time.Second)
		if got.State != wire.StateFailed || got.Attempt != 1 {
			t.Errorf("no policy: %s after %d attempts; want failed at once", got.State, got.Attempt)
		}
		if st, _ := op.QueueStats(context.Background(), "q"); st.DoneCount != 3 {
			t.Errorf("done_count %d, want 3: a retry is not an outcome", st.DoneCount)
		}
	})
}
