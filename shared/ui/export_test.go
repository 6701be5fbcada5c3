package ui

// What the external tests read of the view's sessions.
var (
	CSRFToken = csrfToken
	SessionID = sessionID
)
