package wire

import "testing"

// TestStatusTableRoundTrips: every code the server answers reads back as
// itself from its status alone (a body lost behind a proxy), except codes
// that share a status with one listed first; gateway-only statuses read as
// unavailable.
func TestStatusTableRoundTrips(t *testing.T) {
	shared := map[Code]Code{CodeNoRoute: CodeNotFound}
	for _, e := range statuses {
		want := e.code
		if w, ok := shared[e.code]; ok {
			want = w
		}
		if got := CodeForStatus(Status(e.code)); got != want {
			t.Errorf("CodeForStatus(Status(%s) = %d) = %s, want %s", e.code, Status(e.code), got, want)
		}
	}
	for status, want := range map[int]Code{429: CodeUnavailable, 502: CodeUnavailable, 504: CodeUnavailable, 418: CodeInternal, 200: CodeInternal} {
		if got := CodeForStatus(status); got != want {
			t.Errorf("CodeForStatus(%d) = %s, want %s", status, got, want)
		}
	}
	if got := Status("no such code"); got != 500 {
		t.Errorf("Status of an unknown code = %d, want 500", got)
	}
	for _, c := range []Code{CodeInvalid, CodeUnauthorized, CodeForbidden, CodeNotFound, CodeConflict, CodeWorkerGone,
		CodeTooLarge, CodeInternal, CodeUnavailable, CodeNotAllowed, CodeNoRoute} {
		found := false
		for _, e := range statuses {
			found = found || e.code == c
		}
		if !found {
			t.Errorf("code %s is missing from the status table", c)
		}
	}
}
