package wake

import (
	"sync"
	"testing"
)

func fired(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestWakeOldestFirstAndFew: a wake of n wakes the n oldest waiters of its
// key and no one else; a woken waiter leaves every key it waited on.
func TestWakeOldestFirstAndFew(t *testing.T) {
	var h Hub
	any, hk := Key("q", ""), Key("q", "hk1_x")
	a, cancelA := h.Wait(any, hk)
	b, cancelB := h.Wait(any)
	c, cancelC := h.Wait(any, hk)
	defer cancelA()
	defer cancelB()
	defer cancelC()

	d, cancelD := h.Wait(any, any) // a key named twice is one registration
	if h.Waiting(any) != 4 {
		t.Fatalf("%d waiting on %s, want 4", h.Waiting(any), any)
	}
	cancelD()
	if fired(d) || h.Waiting(any) != 3 {
		t.Fatalf("after a cancel: %d waiting, want 3", h.Waiting(any))
	}
	if got := h.Wake(Key("other", ""), 5); got != 0 {
		t.Fatalf("a wake of another queue woke %d", got)
	}
	if got := h.Wake(any, 1); got != 1 || !fired(a) || fired(b) || fired(c) {
		t.Fatalf("wake 1 of %s: woke %d, a %v b %v c %v; want only a (the oldest)", any, got, fired(a), fired(b), fired(c))
	}
	if h.Waiting(hk) != 1 {
		t.Fatalf("a woken waiter still waits on %s: %d waiting, want 1 (c)", hk, h.Waiting(hk))
	}
	if got := h.Wake(hk, 3); got != 1 || !fired(c) || fired(b) {
		t.Fatalf("wake 3 of %s: woke %d, b %v c %v; want c only", hk, got, fired(b), fired(c))
	}
	cancelB()
	if got := h.Wake(any, 3); got != 0 || h.Waiting(any) != 0 {
		t.Fatalf("after every waiter left, a wake woke %d (%d waiting)", got, h.Waiting(any))
	}
	cancelA() // a cancel after a wake is harmless
}

// TestNilHub: a nil hub never wakes and never fires.
func TestNilHub(t *testing.T) {
	var h *Hub
	c, cancel := h.Wait(Key("q", ""))
	defer cancel()
	if h.Wake(Key("q", ""), 1) != 0 || fired(c) || h.Waiting(Key("q", "")) != 0 {
		t.Fatal("a nil hub woke someone")
	}
}

// TestWakeConcurrent: waits, wakes and cancels from many goroutines; every
// wake reported woke a distinct waiter (run with -race).
func TestWakeConcurrent(t *testing.T) {
	var h Hub
	key := Key("q", "")
	var wg sync.WaitGroup
	var mu sync.Mutex
	fires := 0
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c, cancel := h.Wait(key)
				h.Wake(key, 1)
				if fired(c) {
					mu.Lock()
					fires++
					mu.Unlock()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if fires == 0 || h.Waiting(key) != 0 {
		t.Fatalf("fires %d, %d left waiting", fires, h.Waiting(key))
	}
}
