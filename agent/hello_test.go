package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// helloTestAnswer writes an error answer: the control plane's own wire
// body when code is set, else a bare status (a proxy or load balancer).
func helloTestAnswer(w http.ResponseWriter, status int, code wire.Code) {
	if code == "" {
		http.Error(w, http.StatusText(status), status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wire.BodyFor(&wire.Error{Code: code, Message: "test"}))
}

// TestHelloRefusalIsFinal: a 401 or 403 answer to hello is a refusal (a
// wrong or revoked enrollment token): one attempt, and Run's error is
// ErrHelloRefused (exit 3) as well as ErrHelloFailed. Other answers that
// are not worth retrying, and retries that run out, are ErrHelloFailed
// alone (exit 1).
func TestHelloRefusalIsFinal(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		code     wire.Code
		attempts int
		refused  bool
	}{
		{"401 wrong token", http.StatusUnauthorized, wire.CodeUnauthorized, 1, true},
		{"403 forbidden", http.StatusForbidden, wire.CodeForbidden, 1, true},
		{"401 from a proxy", http.StatusUnauthorized, "", 1, true},
		{"403 from API Gateway's authorizer", http.StatusForbidden, "", 1, true},
		{"400 invalid hello", http.StatusBadRequest, wire.CodeInvalid, 1, false},
		{"503 until the retries run out", http.StatusServiceUnavailable, wire.CodeUnavailable, 3, false},
		{"502 from a proxy until the retries run out", http.StatusBadGateway, "", 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hellos atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/daemon/hello" {
					hellos.Add(1)
				}
				helloTestAnswer(w, tc.status, tc.code)
			}))
			defer srv.Close()
			dir := t.TempDir()
			synctest.Test(t, func(t *testing.T) {
				a, err := New(Config{
					ControlPlane: srv.URL, EnrollToken: "wrong", Queue: "q",
					Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"),
					MachineID: "refused", IntrospectAddr: "off", HelloAttempts: 3,
					Logger: slog.New(slog.DiscardHandler), HTTP: noKeepAlive(), Notifier: nopNotifier{},
				})
				if err != nil {
					t.Fatal(err)
				}
				err = a.Run(context.Background())
				if !errors.Is(err, ErrHelloFailed) || errors.Is(err, ErrHelloRefused) != tc.refused {
					t.Fatalf("Run: %v; want ErrHelloFailed, refused %v", err, tc.refused)
				}
				want := ExitFailure
				if tc.refused {
					want = ExitHelloRefused
				}
				if got := ExitCode(err); got != want {
					t.Fatalf("ExitCode(%v) = %d, want %d", err, got, want)
				}
			})
			if got := int(hellos.Load()); got != tc.attempts {
				t.Fatalf("%d hello attempts, want %d", got, tc.attempts)
			}
		})
	}
}

// TestReHelloRefusedExits3: the control plane lets go of a running worker
// (410 on poll), and the hello that follows is refused (the enrollment
// token was revoked meanwhile): the daemon says bye{hello_failed} and Run's
// error is the refusal (exit 3), not a plain failure (exit 1). When that
// hello finds the control plane unavailable through every retry instead,
// the error is ErrHelloFailed alone (exit 1). A stop (SIGTERM) while that
// hello is still retrying is a clean end (exit 0): the daemon was told to
// stop and has no worker left to say bye for.
func TestReHelloRefusedExits3(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		code    wire.Code
		refused bool
		stop    bool // Stop while the hello retries
	}{
		{"refused", http.StatusUnauthorized, wire.CodeUnauthorized, true, false},
		{"unavailable", http.StatusServiceUnavailable, wire.CodeUnavailable, false, false},
		{"stopped while retrying", http.StatusServiceUnavailable, wire.CodeUnavailable, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := apitest.New(t)
			var broken atomic.Bool // hello answers tc.status from now on
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/daemon/hello" && broken.Load() {
					helloTestAnswer(w, tc.status, tc.code)
					return
				}
				p.Handler.ServeHTTP(w, r)
			}))
			defer front.Close()
			machine := "revoked-" + tc.name
			var runErr error
			synctest.Test(t, func(t *testing.T) {
				a, done := runRegistered(t, p, machine, front.URL)
				broken.Store(true)
				// The control plane lets go of the agent's worker: its next
				// poll gets 410 and it says hello again.
				letGo(t, p, a.Health().Snapshot().WorkerID)
				if tc.stop {
					// Fake time: wait for the 410 (unregistered), then let
					// hello retry a while before the stop.
					waittest.Until(t, time.Minute, "unregistered after its worker was let go", func() bool {
						return a.Health().Snapshot().WorkerID == ""
					})
					time.Sleep(2 * time.Second)
					a.Stop()
				}
				runErr = <-done
			})
			if tc.stop {
				if runErr != nil {
					t.Fatalf("Run: %v; want nil after a stop during hello's retries (exit 0)", runErr)
				}
				return
			}
			if !errors.Is(runErr, ErrHelloFailed) || errors.Is(runErr, ErrHelloRefused) != tc.refused {
				t.Fatalf("Run: %v; want ErrHelloFailed, refused %v", runErr, tc.refused)
			}
			want := ExitFailure
			if tc.refused {
				want = ExitHelloRefused
			}
			if got := ExitCode(runErr); got != want {
				t.Fatalf("ExitCode(%v) = %d, want %d", runErr, got, want)
			}
		})
	}
}

// runRegistered runs, inside a synctest bubble, a daemon of machine whose
// requests go through front, and waits (fake time) until it is registered
// and polling. Its KeepAlive of an hour is a fallback end, should it carry
// on where a test wants it to stop. done answers what Run returned.
func runRegistered(t *testing.T, p *apitest.Plane, machine, front string) (*Agent, <-chan error) {
	t.Helper()
	a := newFakeTimeAgent(t, p, machine, func(c *Config) {
		c.ControlPlane = front
		c.KeepAlive = time.Hour
		c.Notifier = nopNotifier{}
	})
	done := make(chan error)
	go func() { done <- a.Run(context.Background()) }()
	time.Sleep(time.Minute) // fake: registered and polling
	if a.Health().Snapshot().WorkerID == "" {
		t.Fatal("not registered after a minute")
	}
	return a, done
}

// letGo makes the control plane let go of worker id (gone, as a sweep or
// a stopped host would): its next poll gets 410 and the daemon says hello
// again. (A new boot's hello would answer 410 replaced, which stops it:
// TestAgentMachineIDConflict.)
//
// Inside a synctest bubble: its store client is made here, without
// keep-alive, so no connection outlives the call.
func letGo(t *testing.T, p *apitest.Plane, id string) {
	t.Helper()
	db := dynamodb.NewFromConfig(aws.Config{Region: store.EmbeddedRegion, Credentials: credentials.NewStaticCredentialsProvider("local", "local", "")},
		func(o *dynamodb.Options) { o.BaseEndpoint, o.HTTPClient = aws.String(p.Endpoint), noKeepAlive() })
	if _, _, err := store.New(db, p.Prefix).MarkGone(context.Background(), id, nil, domain.EndGone, "let go by the test"); err != nil {
		t.Fatal(err)
	}
}

func TestBootID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := BootID()
		if !ids.Valid("boot", id) {
			t.Fatalf("BootID() = %q, want boot_<ULID>", id)
		}
		if seen[id] {
			t.Fatalf("BootID() repeated %q", id)
		}
		seen[id] = true
	}
}
