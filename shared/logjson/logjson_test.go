package logjson

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/smithy-go/logging"
)

// TestDurationsAreStrings: a duration attribute is logged as "30s", also
// inside a group; other values are left as they are.
func TestDurationsAreStrings(t *testing.T) {
	var b strings.Builder
	New(&b, slog.LevelInfo).Info("hello", "poll_interval", 5*time.Second, "n", 3,
		slog.Group("g", "grace", 1500*time.Millisecond))
	var rec map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["poll_interval"] != "5s" || rec["n"] != float64(3) {
		t.Fatalf("logged %s", b.String())
	}
	if g, _ := rec["g"].(map[string]any); g["grace"] != "1.5s" {
		t.Fatalf("logged %s", b.String())
	}
}

// TestSDKLinesAreJSON: the SDK's warnings reach the log as JSON at warn.
func TestSDKLinesAreJSON(t *testing.T) {
	var b strings.Builder
	SDK(New(&b, slog.LevelInfo)).Logf(logging.Warn, "Response has no supported checksum. Not validating response payload.")
	var rec map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rec); err != nil {
		t.Fatalf("not JSON: %q", b.String())
	}
	if rec["level"] != "WARN" || rec["source"] != "aws-sdk" || !strings.HasPrefix(rec["msg"].(string), "Response has no supported checksum") {
		t.Fatalf("logged %s", b.String())
	}
}
