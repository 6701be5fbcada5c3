package api_test

import (
	"strings"
	"testing"
	"time"

	"log/slog"

	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
)

// lockedBuffer is a log sink the server's goroutines share.
type lockedBuffer struct{ syncbuf.Buffer }

func (l *lockedBuffer) count(s string) int { return strings.Count(l.String(), s) }

// TestUnauthorizedIsWarnedOnceAMinute: refused credentials are logged at
// warn, once a minute per route, the next warning counting what was held
// back; the others at debug.
func TestUnauthorizedIsWarnedOnceAMinute(t *testing.T) {
	c := newClock()
	logs := &lockedBuffer{}
	h := newHarness(t, withClock(c), func(cfg *apitest.Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	for range 5 {
		h.do("GET", "/v1/invocations", "wrong-token", nil).want(t, 401, nil)
	}
	if n := logs.count(`"level":"WARN"`); n != 1 {
		t.Fatalf("%d warnings for 5 refusals in a minute, want 1", n)
	}
	if n := logs.count(`"level":"DEBUG","msg":"request refused"`); n != 4 {
		t.Fatalf("%d refusals at debug, want 4", n)
	}
	c.Advance(61 * time.Second)
	h.do("GET", "/v1/invocations", "wrong-token", nil).want(t, 401, nil)
	if n := logs.count(`"refused_since_last_warning":4`); n != 1 {
		t.Fatalf("the next warning does not count the 4 held back:\n%s", logs.String())
	}
	h.do("POST", "/v1/daemon/poll", "wrong-token", map[string]any{"worker_id": "wrk_01J00000000000000000000000"}).want(t, 401, nil)
	if n := logs.count(`"level":"WARN"`); n != 3 {
		t.Fatalf("another route's refusal was held back behind the first's: %d warnings, want 3", n)
	}
}
