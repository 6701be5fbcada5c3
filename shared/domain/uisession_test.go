package domain

import (
	"testing"
	"time"
)

// TestUISessionEnded: a session ends at its expiry however active, and
// after idle without activity; until then it is not over.
func TestUISessionEnded(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	s := UISession{CreatedAt: t0, LastSeenAt: t0.Add(11 * time.Hour), ExpiresAt: t0.Add(12 * time.Hour)}
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{
		{11 * time.Hour, ""}, {11*time.Hour + 29*time.Minute, ""}, {11*time.Hour + 30*time.Minute, "idle"},
		{12 * time.Hour, "expired"}, {13 * time.Hour, "expired"},
	} {
		if got := s.Ended(t0.Add(tc.at), 30*time.Minute); got != tc.want {
			t.Errorf("at +%s: %q, want %q", tc.at, got, tc.want)
		}
	}
	s.LastSeenAt = t0.Add(11*time.Hour + 50*time.Minute)
	if got := s.Ended(t0.Add(12*time.Hour), time.Hour); got != "expired" {
		t.Errorf("an active session at its expiry: %q", got)
	}
}
