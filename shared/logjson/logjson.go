// Package logjson is the JSON log every Lakeshore process writes: slog's
// JSON handler with durations as Go duration strings ("30s", "1.5ms")
// rather than nanosecond counts, so a reader need not do the arithmetic.
package logjson

import (
	"io"
	"log/slog"
)

// New returns a logger writing JSON lines at level and above to w.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durations}))
}

// durations renders every duration attribute as its string.
func durations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
