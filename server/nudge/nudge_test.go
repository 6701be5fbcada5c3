package nudge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// TestSubmittedNudgesAtMostOncePerEvery: a burst of submits asks for one
// pass; the next after Every asks again; a failed invoke is not the
// submit's error and does not stop the next nudge.
func TestSubmittedNudgesAtMostOncePerEvery(t *testing.T) {
	c := clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	calls := 0
	var fail error
	n := &Nudger{Clock: c.Clock(), Every: 10 * time.Second, Invoke: func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a nudge without a deadline")
		}
		calls++
		return fail
	}}
	for range 5 {
		n.Submitted(context.Background(), domain.Invocation{ID: "inv"})
	}
	if calls != 1 {
		t.Fatalf("%d invokes for a burst, want 1", calls)
	}
	c.Advance(10 * time.Second)
	fail = errors.New("throttled")
	n.Submitted(context.Background(), domain.Invocation{})
	c.Advance(10 * time.Second)
	n.Submitted(context.Background(), domain.Invocation{})
	if calls != 3 {
		t.Fatalf("%d invokes after two more windows, want 3", calls)
	}
}
