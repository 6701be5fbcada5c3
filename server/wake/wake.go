// Package wake lets a long poll that found no work sleep until work it can
// take arrives, instead of re-querying the store on a timer. A waiter
// registers for the claim partitions it may claim from (its queue's work
// for any host and for its own host key); whoever makes work claimable (a
// submit, a hand-back) wakes a few of that partition's waiters, oldest
// first, so one new invocation does not send every idle worker racing for
// it. A Hub is in-process: it wakes the polls this process holds
// (`lakeshore dev`, tests); the polls keep a slow re-query as the fallback
// for work made elsewhere (docs/design.md §5).
package wake

import (
	"slices"
	"sync"
)

// Key names a claim partition: the work of queue for hostKey ("" for work
// any host may run).
func Key(queue, hostKey string) string { return queue + "#" + hostKey }

// WorkerKey names one worker's waiting poll: woken when its row changes (a
// drain, a setup command, a retirement), so the poll ends and the next one
// carries the news. Queue names cannot hold "/", so it never meets a Key.
func WorkerKey(workerID string) string { return "worker/" + workerID }

// Hub wakes waiters by key. The zero value is ready to use, and a nil *Hub
// wakes nobody and never fires. It is safe for concurrent use.
type Hub struct {
	mu      sync.Mutex
	waiters map[string][]*waiter // by key, oldest first
}

type waiter struct {
	c    chan struct{}
	keys []string
}

// Wait registers a waiter for keys and returns the channel that is closed
// when it is woken, and a cancel that unregisters it (call it in every
// case; it is safe to call after a wake). Register before looking for work,
// so a wake between the look and the wait is not lost.
func (h *Hub) Wait(keys ...string) (<-chan struct{}, func()) {
	w := &waiter{c: make(chan struct{}), keys: slices.Compact(slices.Sorted(slices.Values(keys)))}
	if h == nil {
		return w.c, func() {}
	}
	h.mu.Lock()
	if h.waiters == nil {
		h.waiters = map[string][]*waiter{}
	}
	for _, k := range w.keys {
		h.waiters[k] = append(h.waiters[k], w)
	}
	h.mu.Unlock()
	return w.c, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.remove(w)
	}
}

// Wake wakes up to n waiters of key, oldest first, and reports how many it
// woke. A woken waiter is unregistered from all its keys.
func (h *Hub) Wake(key string, n int) int {
	if h == nil || n <= 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	woke := 0
	for woke < n && len(h.waiters[key]) > 0 {
		w := h.waiters[key][0]
		h.remove(w)
		close(w.c)
		woke++
	}
	return woke
}

// Waiting reports how many waiters key has.
func (h *Hub) Waiting(key string) int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters[key])
}

// remove unregisters w from every key; h.mu is held.
func (h *Hub) remove(w *waiter) {
	for _, k := range w.keys {
		ws := h.waiters[k]
		for i, x := range ws {
			if x == w {
				ws = append(ws[:i:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(h.waiters, k)
		} else {
			h.waiters[k] = ws
		}
	}
}
