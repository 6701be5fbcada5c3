package auth

import (
	"sync"
	"time"
)

// limiterPrune is how many keys a Limiter holds before a new key first
// drops those whose window has ended.
const limiterPrune = 1024

// Limiter counts events per key (a route, a client address) in windows of
// Every, each opened by the key's first event after the last one ended,
// and allows Max events a window. It rate-limits what a stream of refused
// credentials costs: the warn lines they log, and the failed logins a
// client may try. The zero value allows nothing; set Every and Max. It is
// safe for concurrent use, and holds a key only while its window runs
// (and until limiterPrune keys are held).
type Limiter struct {
	Every time.Duration
	Max   int

	mu      sync.Mutex
	windows map[string]*window
}

type window struct {
	start time.Time
	n     int
}

// Note records an event for key at now and reports whether it is within
// Max for its window. When it opens a new window, over is how many events
// of the key's last window were beyond Max (then forgotten).
func (l *Limiter) Note(key string, now time.Time) (ok bool, over int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.live(key, now)
	if w == nil {
		if l.windows == nil {
			l.windows = map[string]*window{}
		}
		if old := l.windows[key]; old != nil {
			over = max(old.n-l.Max, 0)
		} else if len(l.windows) >= limiterPrune {
			l.prune(now)
		}
		w = &window{start: now}
		l.windows[key] = w
	}
	w.n++
	return w.n <= l.Max, over
}

// Wait reports how long from now until key may have another event within
// Max: 0 when it may now.
func (l *Limiter) Wait(key string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.live(key, now); w != nil && w.n >= l.Max {
		return w.start.Add(l.Every).Sub(now)
	}
	return 0
}

// live reports key's window running at now, or nil.
func (l *Limiter) live(key string, now time.Time) *window {
	if w := l.windows[key]; w != nil && now.Before(w.start.Add(l.Every)) {
		return w
	}
	return nil
}

// prune drops the keys whose window ended before now.
func (l *Limiter) prune(now time.Time) {
	for k := range l.windows {
		if l.live(k, now) == nil {
			delete(l.windows, k)
		}
	}
}
