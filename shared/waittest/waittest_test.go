package waittest

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf and ends the goroutine,
// as the real one does.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a recorder on a goroutine of its own and returns what
// it recorded.
func run(fn func(tb testing.TB)) string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.fatal
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	if fatal := run(func(tb testing.TB) {
		Until(tb, time.Minute, "the third call", func() bool { calls++; return calls == 3 })
	}); fatal != "" || calls != 3 {
		t.Fatalf("Until: %d calls, failure %q; want 3 calls and no failure", calls, fatal)
	}
}

func TestUntilFailsAfterTheLimit(t *testing.T) {
	fatal := run(func(tb testing.TB) {
		Until(tb, 20*time.Millisecond, "never", func() bool { return false })
	})
	if fatal != "never: not within 20ms" {
		t.Fatalf("failure %q, want %q", fatal, "never: not within 20ms")
	}
}

func TestUntilStateNamesTheLastState(t *testing.T) {
	n := 0
	fatal := run(func(tb testing.TB) {
		UntilState(tb, 20*time.Millisecond, "ten", func() (bool, string) { n++; return false, fmt.Sprintf("%d calls", n) })
	})
	if want := fmt.Sprintf("ten: not within 20ms; last seen: %d calls", n); fatal != want {
		t.Fatalf("failure %q, want %q", fatal, want)
	}
}
