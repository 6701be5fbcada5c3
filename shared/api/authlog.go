package api

import (
	"sync"
	"time"
)

// authWarnEvery is how often a route logs a refused credential at warn; the
// rest of those refusals go at debug, counted in the next warn line.
const authWarnEvery = time.Minute

// authLimiter rate-limits the warn lines of refused credentials (401): a
// stray client, a revoked token or a scanner must be visible without
// flooding the log with one line a request.
type authLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time // route → when it last warned
	held map[string]int       // route → refusals logged at debug since
}

// allow reports whether a refusal on route at now may warn, and how many
// were held back since the last warn (then reset).
func (l *authLimiter) allow(route string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.held = map[string]time.Time{}, map[string]int{}
	}
	if last, ok := l.last[route]; ok && now.Sub(last) < authWarnEvery {
		l.held[route]++
		return false, 0
	}
	held := l.held[route]
	l.last[route], l.held[route] = now, 0
	return true, held
}
