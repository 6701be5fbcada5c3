package auth

import (
	"strconv"
	"testing"
	"time"
)

// TestLimiter: Max events a window per key, the window opened by the
// key's first event; Wait says when the next one may come; the next
// window reports how many went over; keys are apart; ended windows are
// pruned once many keys are held.
func TestLimiter(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	l := &Limiter{Every: time.Minute, Max: 3}
	for i := range 5 {
		if ok, _ := l.Note("a", t0.Add(time.Duration(i)*time.Second)); ok != (i < 3) {
			t.Fatalf("event %d: ok %v", i, ok)
		}
	}
	if w := l.Wait("a", t0.Add(10*time.Second)); w != 50*time.Second {
		t.Fatalf("Wait %s, want 50s (the window opened at t0)", w)
	}
	if ok, _ := l.Note("b", t0.Add(10*time.Second)); !ok || l.Wait("b", t0.Add(10*time.Second)) != 0 {
		t.Fatal("another key is held back by a's window")
	}
	if ok, over := l.Note("a", t0.Add(time.Minute)); !ok || over != 2 {
		t.Fatalf("the next window: ok %v, over %d, want true, 2", ok, over)
	}
	for i := range limiterPrune + 10 {
		l.Note(strconv.Itoa(i), t0.Add(time.Hour))
	}
	if n := len(l.windows); n > limiterPrune+10 || l.windows["b"] != nil {
		t.Fatalf("%d keys held, b's ended window among them: %v", n, l.windows["b"] != nil)
	}
	var zero Limiter
	if ok, _ := zero.Note("x", t0); ok {
		t.Fatal("the zero Limiter allowed an event")
	}
}
