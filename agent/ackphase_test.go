package agent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/acks"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// endedBody is a run that has ended with outcome.
type endedBody struct {
	id      string
	outcome process.Outcome
	done    chan struct{}
}

func newEndedBody(id string, o process.Outcome) *endedBody {
	b := &endedBody{id: id, outcome: o, done: make(chan struct{})}
	close(b.done)
	return b
}

func (b *endedBody) InvocationID() string                { return b.id }
func (b *endedBody) Attempt() int                        { return 1 }
func (b *endedBody) Done() <-chan struct{}               { return b.done }
func (b *endedBody) Outcome() process.Outcome            { return b.outcome }
func (b *endedBody) Cancel()                             {}
func (b *endedBody) Kill()                               {}
func (b *endedBody) Pid() int                            { return 0 }
func (b *endedBody) Unconfirmed() (pgid int, pids []int) { return 0, nil }
func (b *endedBody) LogFiles() (string, string)          { return "", "" }
func (b *endedBody) Signal(syscall.Signal) bool          { return false }

// TestAckCarriesThePhase: the ack of a run whose end the daemon handles
// carries the daemon's phase at that moment: a body handing itself back
// during the drain is acked requeued in phase draining (or terminating),
// an ordinary outcome in phase ready. The control plane accepts a
// requeued ack only from a worker that drains, and may not have seen the
// drain in a poll yet.
func TestAckCarriesThePhase(t *testing.T) {
	var mu sync.Mutex
	got := map[string]wire.AckRequest{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req wire.AckRequest
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/daemon/ack" || json.Unmarshal(b, &req) != nil {
			http.Error(w, "not an ack", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got[req.InvocationID] = req
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(wire.AckResponse{Recorded: true, State: wire.StateQueued})
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	a, err := New(Config{ControlPlane: srv.URL, EnrollToken: "enroll", Queue: "q",
		Workdir: filepath.Join(dir, "work"), StateDir: filepath.Join(dir, "state"), MachineID: "ackphase",
		IntrospectAddr: "off", Grace: DefaultGrace, KillAfter: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	spool, err := acks.OpenSpool(a.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	a.ackDone = map[string]func(bool){}
	a.acker = acks.New(spool, acks.Options{Logger: a.log, OnAnswered: a.ackAnswered})
	sess := session{workerID: "wrk_ackphase", token: "tok"}

	code := func(n int) *int { return &n }
	for _, c := range []struct {
		id        string
		phase     phase
		o         process.Outcome
		wantState string
	}{
		{"inv_draining", phaseDraining, process.Outcome{State: wire.StateFailed, ExitCode: code(75),
			Error: &wire.ErrorInfo{Type: process.ErrorTypeExitCode}}, wire.AckRequeued},
		{"inv_terminating", phaseTerminating, process.Outcome{State: wire.StateFailed, ExitCode: code(75),
			Error: &wire.ErrorInfo{Type: process.ErrorTypeExitCode}}, wire.AckRequeued},
		{"inv_ready", phaseReady, process.Outcome{State: wire.StateSucceeded, ExitCode: code(0)}, wire.StateSucceeded},
	} {
		st := &state{phase: c.phase, sess: sess, runs: map[string]*running{}}
		a.settle(context.Background(), st, &running{run: newEndedBody(c.id, c.o), session: sess, requeueExitCodes: []int{75}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		left := a.acker.Flush(ctx)
		cancel()
		if left != 0 {
			t.Fatalf("%s: %d acks unanswered", c.id, left)
		}
		mu.Lock()
		ack, ok := got[c.id]
		mu.Unlock()
		if !ok || ack.State != c.wantState || ack.Phase != c.phase.String() {
			t.Errorf("%s: ack %+v (sent %v); want state %s in phase %s", c.id, ack, ok, c.wantState, c.phase)
		}
	}
}
