package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Fuzz flags: what the run and the request look like.
const (
	fuzzDraining = 1 << iota // the daemon drains (else a wait would hold, and is cut at once)
	fuzzStarted              // the body started
	fuzzAttached             // the run has a process group
	fuzzLocal                // the request knows its local address
)

// recorder notes whether the handler answered at all.
type recorder struct {
	*httptest.ResponseRecorder
	answered bool
}

func (r *recorder) WriteHeader(code int) {
	r.answered = true
	r.ResponseRecorder.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.answered = true
	return r.ResponseRecorder.Write(b)
}

// FuzzLifecycleView sends the endpoint's handler requests with any
// method, path, query, body and remote address, for a run in any phase:
// it never panics or answers 5xx, and only the run's own peer (the one
// address the peer check accepts), at the run's own URL, is ever answered
// 2xx, held, or hands the run back; no other answer carries the run's
// secret or what the view says of it.
func FuzzLifecycleView(f *testing.F) {
	peerAddr := netip.MustParseAddrPort("127.0.0.1:40000")
	local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	all := uint8(fuzzDraining | fuzzStarted | fuzzAttached | fuzzLocal)
	for _, seed := range []struct {
		method, path, query string
		body                []byte
		remote              string
		mode, flags         uint8
	}{
		{"GET", "", "", nil, "127.0.0.1:40000", 1, all},
		{"GET", "", "wait=draining", nil, "127.0.0.1:40000", 1, all},
		{"GET", "", "wait=draining", nil, "127.0.0.1:40000", 1, all &^ fuzzDraining},
		{"POST", "/requeue", "", []byte("{}"), "[::ffff:127.0.0.1]:40000", 1, all},
		{"POST", "/requeue", "", nil, "127.0.0.1:40000", 1, all &^ fuzzDraining},
		{"GET", "", "", nil, "127.0.0.1:40001", 1, all},
		{"DELETE", "", "", nil, "127.0.0.1:40000", 1, all},
		{"GET", "/../x", "wait=ready", nil, "127.0.0.1:40000", 1, all},
		{"GET", "guess", "", nil, "127.0.0.1:40000", 2, all},
		{"GET", "/v1/lifecycle", "", nil, "bogus", 0, 0},
		{"HEAD", "", "", nil, "127.0.0.1:40000", 1, fuzzStarted | fuzzLocal},
	} {
		f.Add(seed.method, seed.path, seed.query, seed.body, seed.remote, seed.mode, seed.flags)
	}
	f.Fuzz(func(t *testing.T, method, path, query string, body []byte, remote string, mode, flags uint8) {
		s := newServer(Config{Logger: slog.New(slog.DiscardHandler), Members: func(int) []int { return nil }}, "http://127.0.0.1:1")
		s.peer = func(r, l netip.AddrPort, pgid int, _ func(int) []int) error {
			if r == peerAddr && l.String() == local.String() && pgid == 4242 {
				return nil
			}
			return errors.New("not the run's peer")
		}
		const invocation = "inv_fuzz_7c1d"
		h, err := s.Add(Run{HostKey: "hk1_fuzz", WorkerID: "wrk_fuzz", InvocationID: invocation, Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		secret := strings.TrimPrefix(h.URL(), s.base+pathPrefix)
		started := make(chan struct{})
		if flags&fuzzStarted != 0 {
			close(started)
		}
		requeued := 0
		if flags&fuzzAttached != 0 {
			h.Attach(started, func() int { return 4242 }, func() { requeued++ })
		}
		if flags&fuzzDraining != 0 {
			s.Drain(time.Now().Add(time.Minute))
		}
		switch mode % 3 {
		case 1:
			path = pathPrefix + secret + path
		case 2:
			path = pathPrefix + path
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if flags&fuzzLocal != 0 {
			ctx = context.WithValue(ctx, http.LocalAddrContextKey, net.Addr(local))
		}
		if flags&fuzzDraining == 0 {
			cancel() // a wait for the drain returns at once, unanswered
		}
		req := (&http.Request{
			Method: method, URL: &url.URL{Path: path, RawQuery: query}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
			Host: "127.0.0.1:1", RemoteAddr: remote,
		}).WithContext(ctx)
		rec := &recorder{ResponseRecorder: httptest.NewRecorder()}
		s.ServeHTTP(rec, req)

		ra, err := netip.ParseAddrPort(remote)
		isPeer := err == nil && unmap(ra) == peerAddr && flags&fuzzLocal != 0 && flags&fuzzAttached != 0
		// The run's secret is the path's segment after the prefix.
		rest, ownURL := strings.CutPrefix(path, pathPrefix+secret)
		ownURL = ownURL && (rest == "" || rest[0] == '/')
		code, answer := rec.Code, rec.Body.String()
		switch {
		case !rec.answered:
			if !isPeer || !ownURL || req.URL.Query().Get("wait") != PhaseDraining || flags&fuzzDraining != 0 {
				t.Fatalf("%s %q ?%s from %q left unanswered", method, path, query, remote)
			}
		case code >= 500:
			t.Fatalf("%s %q ?%s from %q: %d %s", method, path, query, remote, code, answer)
		case code >= 200 && code < 300:
			if !isPeer || !ownURL {
				t.Fatalf("%s %q ?%s from %q (peer %v, own URL %v): %d %s", method, path, query, remote, isPeer, ownURL, code, answer)
			}
		default:
			if strings.Contains(answer, invocation) || strings.Contains(answer, "hk1_fuzz") {
				t.Fatalf("%s %q from %q: a %d tells of the run: %s", method, path, remote, code, answer)
			}
		}
		if strings.Contains(answer, secret) || strings.Contains(rec.Header().Get("Allow"), secret) {
			t.Fatalf("%s %q from %q: the answer carries the run's secret", method, path, remote)
		}
		if requeued > 0 && (code != http.StatusAccepted || !isPeer || flags&fuzzDraining == 0) {
			t.Fatalf("%s %q from %q handed the run back (%d)", method, path, remote, code)
		}
	})
}
