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

// SetArtifactReads makes a run's page read the artifacts of at most jobs
// jobs, listing at most rows, until t ends.
func SetArtifactReads(t testing.TB, jobs, rows int) {
	was, wasRows := artifactJobReads, artifactRows
	artifactJobReads, artifactRows = jobs, rows
	t.Cleanup(func() { artifactJobReads, artifactRows = was, wasRows })
}
