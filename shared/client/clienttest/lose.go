// Package clienttest holds test support for callers of the client: a
// proxy that loses answers on their way back, for proving that a retried
// request makes nothing twice.
package clienttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
)

// maxBody bounds a request body the proxy reads to record it.
const maxBody = 8 << 20

// LosingProxy forwards every request to a real control plane, but for the
// first Lose POSTs to Path it throws the control plane's 2xx answer away:
// it closes the connection (a transport error to the client) or, when
// Status is set, answers that status instead. A forwarded POST that the
// control plane did not accept is answered 418 with its answer quoted, so
// a test sees it was not what the test meant to lose.
type LosingProxy struct {
	Path   string
	Lose   int
	Status int

	proxy  *httputil.ReverseProxy
	mu     sync.Mutex
	bodies [][]byte
}

// NewLosingProxy returns a proxy to the control plane at target.
func NewLosingProxy(target *url.URL, path string, lose, status int) *LosingProxy {
	return &LosingProxy{Path: path, Lose: lose, Status: status, proxy: httputil.NewSingleHostReverseProxy(target)}
}

// Bodies reports the body of each POST to Path so far, in order.
func (l *LosingProxy) Bodies() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.bodies...)
}

// ServeHTTP implements http.Handler.
func (l *LosingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != l.Path {
		l.proxy.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	l.bodies = append(l.bodies, body)
	lose := len(l.bodies) <= l.Lose
	l.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if !lose {
		l.proxy.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	l.proxy.ServeHTTP(rec, r)
	if rec.Code < 200 || rec.Code > 299 {
		http.Error(w, fmt.Sprintf("the forwarded POST answered %d: %s", rec.Code, rec.Body), http.StatusTeapot)
		return
	}
	if l.Status != 0 {
		http.Error(w, "the answer was lost", l.Status)
		return
	}
	if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// IdempotencyKeys reports the idempotency_key of each POST to Path so far
// ("" for a body without one, or not JSON).
func (l *LosingProxy) IdempotencyKeys() []string {
	var keys []string
	for _, b := range l.Bodies() {
		var req struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		_ = json.Unmarshal(b, &req)
		keys = append(keys, req.IdempotencyKey)
	}
	return keys
}
