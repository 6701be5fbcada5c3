package health

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
)

// introspectServe serves h on a free loopback port for the test's lifetime.
func introspectServe(t *testing.T, h *Tracker) string {
	t.Helper()
	stop, addr, err := ServeIntrospect("127.0.0.1:0", h, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return addr
}

// introspectGet fetches path and decodes the snapshot it answers with.
func introspectGet(t *testing.T, addr, path string) (int, Snapshot) {
	t.Helper()
	res, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type = %q", path, ct)
	}
	var s Snapshot
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("%s: %v in %s", path, err, body)
	}
	return res.StatusCode, s
}

func TestIntrospectEndpoints(t *testing.T) {
	c := clock.NewFake(healthEpoch)
	h := New(clock.Of(c.Now), Options{})
	addr := introspectServe(t, h)
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("bound %q, want 127.0.0.1 and a real port", addr)
	}

	// Booting: /status answers, the probes say no.
	for path, want := range map[string]int{"/status": 200, "/readyz": 503, "/livez": 503} {
		if code, s := introspectGet(t, addr, path); code != want || s.ReadyReason != ReasonNotStarted {
			t.Errorf("booting %s = %d %q, want %d %q", path, code, s.ReadyReason, want, ReasonNotStarted)
		}
	}

	healthServing(h)
	for _, path := range []string{"/status", "/readyz", "/livez"} {
		code, s := introspectGet(t, addr, path)
		if code != 200 || !s.Ready || !s.Live || s.WorkerID == "" {
			t.Errorf("serving %s = %d %+v, want 200, ready and live", path, code, s)
		}
	}

	// A server outage: unready, still live.
	h.RequestStarted(RolePoll)(false)
	if code, s := introspectGet(t, addr, "/readyz"); code != 503 || s.ReadyReason != ReasonServerUnavailable+RolePoll {
		t.Errorf("outage /readyz = %d %q", code, s.ReadyReason)
	}
	if code, _ := introspectGet(t, addr, "/livez"); code != 200 {
		t.Errorf("outage /livez = %d, want 200", code)
	}

	res, err := http.Post("http://"+addr+"/status", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status = %d, want 405", res.StatusCode)
	}
	res, err = http.Get("http://" + addr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ = %d, want 404", res.StatusCode)
	}
}

// TestIntrospectStalledLoop: the probe server runs apart from the main loop,
// so a loop that stopped ticking is reported rather than hiding the probe.
func TestIntrospectStalledLoop(t *testing.T) {
	c := clock.NewFake(healthEpoch)
	h := New(clock.Of(c.Now), Options{})
	addr := introspectServe(t, h)
	healthServing(h)
	c.Advance(DefaultLoopStall + time.Second)

	if code, s := introspectGet(t, addr, "/livez"); code != 503 || s.LiveReason != ReasonEventLoopStalled {
		t.Errorf("/livez = %d %q, want 503 %q", code, s.LiveReason, ReasonEventLoopStalled)
	}
	if code, s := introspectGet(t, addr, "/readyz"); code != 503 || s.ReadyReason != ReasonEventLoopStalled {
		t.Errorf("/readyz = %d %q, want 503 %q", code, s.ReadyReason, ReasonEventLoopStalled)
	}
	code, s := introspectGet(t, addr, "/status")
	if code != 200 || s.Live || s.SinceLastTickS == nil || *s.SinceLastTickS != 31 {
		t.Errorf("/status = %d %+v, want 200, not live, tick 31 s old", code, s)
	}
}

func TestIntrospectRefusesRoutable(t *testing.T) {
	tests := []struct {
		addr string
		want string // a fragment of the error
	}{
		{"0.0.0.0:7788", "introspect address 0.0.0.0:7788 is routable; nymph binds loopback only, e.g. 127.0.0.1:7788"},
		{"10.0.0.1:7788", "introspect address 10.0.0.1:7788 is routable"},
		{"[::]:7788", "introspect address [::]:7788 is routable"},
		{"[::ffff:10.0.0.1]:7788", "is routable"},
		{"[fd00:ec2::254]:7788", "is routable"},
		{":7788", "is not a loopback IP or localhost; nymph binds loopback only, e.g. 127.0.0.1:7788"},
		{"example.com:7788", "is not a loopback IP or localhost"},
		{"localhost.example.com:7788", "is not a loopback IP or localhost"},
		{"127.0.0.1", "missing port"},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			// Refused before any socket is opened: a routable address is
			// only parsed, never bound or dialled.
			stop, bound, err := ServeIntrospect(tt.addr, New(clock.Clock{}, Options{}), nil)
			if err == nil {
				_ = stop(context.Background())
				t.Fatalf("ServeIntrospect(%q) bound %s, want an error", tt.addr, bound)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "loopback") {
				t.Errorf("error = %q, want it to contain %q and name loopback", err, tt.want)
			}
			if bound != "" || stop == nil {
				t.Errorf("bound = %q, stop nil = %v", bound, stop == nil)
			}
		})
	}
}

func TestIntrospectLoopbackAddrs(t *testing.T) {
	tests := map[string]string{
		"127.0.0.1:7788":       "127.0.0.1:7788",
		"127.8.9.10:7788":      "127.8.9.10:7788",
		"[::1]:7788":           "[::1]:7788",
		"[::ffff:127.0.0.1]:0": "[::ffff:127.0.0.1]:0",
		"localhost:7788":       "127.0.0.1:7788",
		"LocalHost:0":          "127.0.0.1:0",
	}
	for addr, want := range tests {
		got, err := introspectListenAddr(addr)
		if err != nil || got != want {
			t.Errorf("introspectListenAddr(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}

func TestIntrospectLocalhostBinds(t *testing.T) {
	stop, addr, err := ServeIntrospect("localhost:0", New(clock.Clock{}, Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("localhost bound %q, want 127.0.0.1", addr)
	}
}

func TestIntrospectOff(t *testing.T) {
	for _, addr := range []string{"", "off"} {
		stop, bound, err := ServeIntrospect(addr, New(clock.Clock{}, Options{}), nil)
		if err != nil || bound != "" {
			t.Errorf("ServeIntrospect(%q) = %q, %v; want disabled", addr, bound, err)
		}
		if err := stop(context.Background()); err != nil {
			t.Errorf("stop of disabled introspection: %v", err)
		}
	}
}

func TestIntrospectStop(t *testing.T) {
	stop, addr, err := ServeIntrospect("127.0.0.1:0", New(clock.Clock{}, Options{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := http.Get("http://" + addr + "/status"); err == nil {
		res.Body.Close()
		t.Errorf("GET after stop answered %d, want a refused connection", res.StatusCode)
	}
}
