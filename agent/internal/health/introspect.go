package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// ServeIntrospect serves GET /status (200 and the snapshot as JSON), /readyz
// and /livez (200 or 503 with the snapshot), and /metrics (the snapshot as
// Prometheus text) on addr, on its own listener and
// goroutine, so it answers even while the main loop is stalled: that is when
// /livez matters. It refuses a routable address — only a loopback IP
// (127.0.0.0/8, ::1) or "localhost" — because the run state never leaves the
// host. An empty addr or "off" disables it: stop is then a no-op and
// boundAddr is empty. stop shuts the server down gracefully within ctx.
func ServeIntrospect(addr string, h *Tracker, log *slog.Logger) (stop func(context.Context) error, boundAddr string, err error) {
	noop := func(context.Context) error { return nil }
	if addr == "" || addr == "off" {
		return noop, "", nil
	}
	listen, err := introspectListenAddr(addr)
	if err != nil {
		return noop, "", err
	}
	if log == nil {
		log = slog.New(slog.NewJSONHandler(io.Discard, nil))
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return noop, "", fmt.Errorf("introspect: %w", err)
	}
	srv := &http.Server{
		Handler:           introspectHandler(h),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      5 * time.Second,
		IdleTimeout:       30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("introspect server stopped", "addr", ln.Addr().String(), "error", err.Error())
		}
	}()
	return srv.Shutdown, ln.Addr().String(), nil
}

// introspectListenAddr checks that addr names a loopback address and returns
// what to listen on. "localhost" becomes 127.0.0.1 rather than whatever the
// resolver says, so the check and the bind cannot disagree.
func introspectListenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("introspect address %q: %v; nymph binds loopback only, e.g. 127.0.0.1:7788", addr, err)
	}
	example := net.JoinHostPort("127.0.0.1", port)
	if strings.EqualFold(host, "localhost") {
		return example, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("introspect address %s is not a loopback IP or localhost; nymph binds loopback only, e.g. %s", addr, example)
	}
	if !ip.Unmap().IsLoopback() {
		return "", fmt.Errorf("introspect address %s is routable; nymph binds loopback only, e.g. %s", addr, example)
	}
	return addr, nil
}

// introspectHandler answers /status, /readyz and /livez from h.Snapshot,
// which does no I/O and never waits on the main loop.
func introspectHandler(h *Tracker) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		writeSnapshot(w, http.StatusOK, h.Snapshot())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		s := h.Snapshot()
		writeSnapshot(w, probeStatus(s.Ready), s)
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		s := h.Snapshot()
		writeSnapshot(w, probeStatus(s.Live), s)
	})
	mux.Handle("GET /metrics", metricsHandler(h))
	return mux
}

func probeStatus(ok bool) int {
	if ok {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

func writeSnapshot(w http.ResponseWriter, code int, s Snapshot) {
	body, err := json.Marshal(s)
	if err != nil { // a Snapshot is plain data; this cannot happen
		http.Error(w, "snapshot", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}
