package ui

// What the external tests read of the view's sessions.
var (
	CSRFToken = (*UI)(nil).csrfToken
	SessionID = sessionID
)
