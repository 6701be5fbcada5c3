package ui

import "testing"

// What the external tests read of the view's sessions.
var (
	CSRFToken = (*UI)(nil).csrfToken
	SessionID = sessionID
)

// SetResultsPaging makes a run's page read its results in pages of page
// jobs, at most pages of them, until t ends.
func SetResultsPaging(t testing.TB, page, pages int) {
	was, wasPages := resultsPage, resultsPages
	resultsPage, resultsPages = page, pages
	t.Cleanup(func() { resultsPage, resultsPages = was, wasPages })
}

// SetDetailReads makes a run's page read at most n jobs' invocations,
// until t ends.
func SetDetailReads(t testing.TB, n int) {
	was := detailReads
	detailReads = n
	t.Cleanup(func() { detailReads = was })
}
