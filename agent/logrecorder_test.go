package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// logRecord is one record a logRecorder kept, its attributes resolved.
type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]any
}

func (r logRecord) String() string {
	keys := make([]string, 0, len(r.Attrs))
	for k := range r.Attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.Level, r.Msg)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%v", k, r.Attrs[k])
	}
	return b.String()
}

// logRecorder keeps every record logged through its loggers, so a test can
// assert on what was logged and wait for a record instead of sleeping.
type logRecorder struct {
	mu      sync.Mutex
	records []logRecord
	changed chan struct{} // closed and replaced on each record
}

func newLogRecorder() *logRecorder { return &logRecorder{changed: make(chan struct{})} }

func (l *logRecorder) logger() *slog.Logger { return slog.New(logRecorderHandler{l: l}) }

// all reports the records kept so far.
func (l *logRecorder) all() []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}

// find reports the records that match.
func (l *logRecorder) find(match func(logRecord) bool) []logRecord {
	var out []logRecord
	for _, r := range l.all() {
		if match(r) {
			out = append(out, r)
		}
	}
	return out
}

// wait reports the first record that matches, waiting for it for at most
// 30 s.
func (l *logRecorder) wait(t *testing.T, what string, match func(logRecord) bool) logRecord {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		changed := l.changed
		recs := slices.Clone(l.records)
		l.mu.Unlock()
		for _, r := range recs {
			if match(r) {
				return r
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not logged within 30 s", what)
		}
	}
}

type logRecorderHandler struct {
	l     *logRecorder
	attrs []slog.Attr
}

func (h logRecorderHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logRecorderHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]any{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.Resolve().Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().Any()
		return true
	})
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	h.l.records = append(h.l.records, rec)
	close(h.l.changed)
	h.l.changed = make(chan struct{})
	return nil
}

func (h logRecorderHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logRecorderHandler{l: h.l, attrs: append(slices.Clip(h.attrs), as...)}
}

// WithGroup keeps the attributes flat: the agent logs no groups.
func (h logRecorderHandler) WithGroup(string) slog.Handler { return h }
