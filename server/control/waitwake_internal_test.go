package control

import (
	"context"
	"testing"
	"time"
)

// TestWaitWakeSaysWhatEndedIt: a wait reports news before work when both
// have come (news ends a held poll without a claim), work alone as work,
// and a full sleep as the clock's.
func TestWaitWakeSaysWhatEndedIt(t *testing.T) {
	held := func(ctx context.Context, _ time.Duration) error { <-ctx.Done(); return ctx.Err() }
	slept := func(context.Context, time.Duration) error { return nil }
	closed := func() chan struct{} { c := make(chan struct{}); close(c); return c }
	for _, c := range []struct {
		name       string
		work, news chan struct{}
		sleep      func(context.Context, time.Duration) error
		want       int
	}{
		{"both", closed(), closed(), held, wokenByNews},
		{"work", closed(), make(chan struct{}), held, wokenByWork},
		{"news", make(chan struct{}), closed(), held, wokenByNews},
		{"clock", make(chan struct{}), make(chan struct{}), slept, wokenByClock},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Service{sleep: c.sleep}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			waited, by, err := s.waitWake(ctx, c.work, c.news, time.Second)
			if err != nil || by != c.want {
				t.Fatalf("waitWake = %s, %d, %v; want ended by %d", waited, by, err, c.want)
			}
			if by == wokenByClock && waited != time.Second {
				t.Fatalf("a full sleep counted %s of 1s", waited)
			}
		})
	}
}
