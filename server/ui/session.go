package ui

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// The session: a login with an operator token stores a session in the
// store (Sessions), keyed by a hash of a random 256-bit secret, which the
// browser holds in a cookie. The store has the session's times and a
// fingerprint of the token that opened it, never the secret or the token.
// Every request reads the session back (strongly consistent: a logout on
// one api instance holds on all) and refuses it when it is gone (logged
// out), past its 12 h, idle past SessionIdle, or opened with a token the
// control plane no longer accepts (a rotation's last step ends it).
//
// The CSRF token is an HMAC of a constant under the session's secret: a
// form or script of this origin carries it, a page of another origin
// cannot read it, and nothing but the cookie's holder can compute it.

// Sessions is where the view keeps its sessions: the store, through the
// calls the view makes (store.Store implements it).
type Sessions interface {
	// CreateUISession stores a new session.
	CreateUISession(ctx context.Context, s domain.UISession) error
	// UISession reads session id, and false when there is none.
	UISession(ctx context.Context, id string) (domain.UISession, bool, error)
	// TouchUISession records activity at seen, if later than the last.
	TouchUISession(ctx context.Context, id string, seen time.Time) error
	// EndUISession ends session id for every later read.
	EndUISession(ctx context.Context, id string) error
}

const (
	cookieName = "lakeshore_session"
	sessionTTL = 12 * time.Hour
	// DefaultSessionIdle is how long a session may go without a page load
	// or an action, unless Config.SessionIdle says otherwise.
	DefaultSessionIdle = 30 * time.Minute
	// touchEvery is how stale a session's recorded activity may get: a
	// page load writes it at most once this often.
	touchEvery = time.Minute
	// secretBytes is the size of a session's secret.
	secretBytes = 32
	csrfField   = "csrf"
	csrfHeader  = "X-CSRF-Token"
)

// sessionID is the stored name of the session whose secret is secret.
func sessionID(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// wellFormed reports whether v can be a session's secret (the cookie's
// value): base64url of secretBytes, without padding.
func wellFormed(v string) bool {
	if len(v) != base64.RawURLEncoding.EncodedLen(secretBytes) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil
}

// tokenFingerprint names an operator token in the store: an HMAC under the
// token, so the stored value says which token opened a session without
// being the token or its plain hash.
func tokenFingerprint(tok string) string {
	m := hmac.New(sha256.New, []byte(tok))
	m.Write([]byte("lakeshore ui session token v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// acceptedFingerprint reports the fingerprint of tok when it is one of
// the operator tokens the control plane accepts now (compared in constant
// time, each of them), and false otherwise.
func (u *UI) acceptedFingerprint(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	fp := tokenFingerprint(tok)
	return fp, u.accepts(fp)
}

// accepts reports whether fingerprint fp names an operator token the
// control plane accepts now: the current one or, during a rotation, the
// previous.
func (u *UI) accepts(fp string) bool {
	ok := false
	for _, want := range u.fingerprints {
		ok = hmac.Equal([]byte(fp), []byte(want)) || ok
	}
	return ok
}

// newSession stores a session opened at now with the token of fingerprint
// fp, and reports its secret.
func (u *UI) newSession(ctx context.Context, fp string, now time.Time) (string, error) {
	secret, err := auth.Random(secretBytes)
	if err != nil {
		return "", fmt.Errorf("a session secret: %w", err)
	}
	err = u.cfg.Sessions.CreateUISession(ctx, domain.UISession{ID: sessionID(secret), TokenFingerprint: fp,
		CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(sessionTTL)})
	if err != nil {
		return "", fmt.Errorf("store the session: %w", err)
	}
	return secret, nil
}

// session reports the secret of the request's live session, or "" when
// it has none; an error when the store could not tell. A page load or an
// action is activity and keeps the session from going idle; the live
// parts' refresh (every 2 s while a page is open) is not, so a page left
// open on an unattended screen ends like any idle session.
func (u *UI) session(r *http.Request) (string, error) {
	c, err := r.Cookie(cookieName)
	if err != nil || !wellFormed(c.Value) {
		return "", nil
	}
	id := sessionID(c.Value)
	s, ok, err := u.cfg.Sessions.UISession(r.Context(), id)
	if err != nil {
		return "", fmt.Errorf("read the session: %w", err)
	}
	now := u.now()
	if !ok {
		return "", nil
	}
	if why := s.Ended(now, u.cfg.SessionIdle); why != "" {
		u.log.Debug("ui: refused a session", "why", why)
		return "", nil
	}
	if !u.accepts(s.TokenFingerprint) {
		u.log.Debug("ui: refused a session", "why", "opened with an operator token no longer accepted")
		return "", nil
	}
	if !liveRefresh(r) && now.Sub(s.LastSeenAt) >= touchEvery {
		if err := u.cfg.Sessions.TouchUISession(r.Context(), id, now); err != nil {
			// The request goes on: the session may go idle a minute early.
			u.log.Warn("ui: record a session's activity", "error", err.Error())
		}
	}
	return c.Value, nil
}

// liveRefresh reports whether r is the script's refresh of a page's parts.
func liveRefresh(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/live")
}

// csrfToken is the CSRF token of the session whose secret is secret.
func (*UI) csrfToken(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("lakeshore ui csrf v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// csrfOK reports whether r carries the CSRF token of its session, in the
// form or the header.
func (u *UI) csrfOK(r *http.Request, secret string) bool {
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && hmac.Equal([]byte(got), []byte(u.csrfToken(secret)))
}

// setSession writes the session cookie (value "" clears it). It is Secure
// unless the page is served on loopback over plain HTTP (lakeshore dev).
func setSession(w http.ResponseWriter, r *http.Request, value string, exp time.Time) {
	c := &http.Cookie{Name: cookieName, Value: value, Path: "/ui", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: !loopback(r)}
	if value == "" {
		c.MaxAge = -1
	} else {
		c.Expires = exp
	}
	http.SetCookie(w, c)
}

// loopback reports whether r came to a loopback host over plain HTTP.
func loopback(r *http.Request) bool {
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		return false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
