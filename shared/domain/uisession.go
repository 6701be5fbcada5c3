package domain

import "time"

// UISession is one login to the web view as the store keeps it. It holds
// neither the session's secret (the browser's cookie; ID is a hash of it)
// nor the operator token that opened it (TokenFingerprint is a keyed hash
// of it), so a reader of the table can neither replay a session nor learn
// a token.
type UISession struct {
	// ID is the hex SHA-256 of the session's secret.
	ID string
	// TokenFingerprint names the operator token the login gave: the
	// session ends when the control plane no longer accepts that token.
	TokenFingerprint string
	CreatedAt        time.Time
	// LastSeenAt is the session's last activity (a page load or an
	// action), written at most once a minute.
	LastSeenAt time.Time
	// ExpiresAt is when the session ends, however active.
	ExpiresAt time.Time
}

// Ended reports why the session is over at now, where idle is how long a
// session may go without activity: "expired" (its 12 h, or whatever its
// login gave it, are up), "idle", or "" while it is not over.
func (s UISession) Ended(now time.Time, idle time.Duration) string {
	switch {
	case !now.Before(s.ExpiresAt):
		return "expired"
	case !now.Before(s.LastSeenAt.Add(idle)):
		return "idle"
	}
	return ""
}
