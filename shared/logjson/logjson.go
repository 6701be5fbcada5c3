// Package logjson is the JSON log every Lakeshore process writes: slog's
// JSON handler with durations as Go duration strings ("30s", "1.5ms")
// rather than nanosecond counts, so a reader need not do the arithmetic.
package logjson

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/aws/smithy-go/logging"
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

// SDK routes the AWS SDK's own log lines (retries, missing checksums,
// deprecations) into log, as JSON like every other line: warnings at warn,
// debug lines at debug. Give it as config.WithLogger (or aws.Config.Logger).
func SDK(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(c logging.Classification, format string, v ...any) {
		level := slog.LevelInfo
		switch c {
		case logging.Warn:
			level = slog.LevelWarn
		case logging.Debug:
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, fmt.Sprintf(format, v...), "source", "aws-sdk")
	})
}
