package ui

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/shared/auth"
)

// The session: after a login with the operator token, a cookie holding its
// expiry and an HMAC of it under a key derived from that token. Nothing is
// stored server-side, so every api instance (Lambda) accepts it, and a new
// operator token ends every session. The CSRF token is an HMAC of the
// session cookie: a form or script of this origin carries it, a page of
// another origin cannot read it.

const (
	cookieName = "lakeshore_session"
	sessionTTL = 12 * time.Hour
	csrfField  = "csrf"
	csrfHeader = "X-CSRF-Token"
)

// sessionKey derives the signing key from the operator token.
func sessionKey(operatorToken string) []byte {
	m := hmac.New(sha256.New, []byte(operatorToken))
	m.Write([]byte("lakeshore ui session v1"))
	return m.Sum(nil)
}

func (u *UI) mac(parts ...string) string {
	m := hmac.New(sha256.New, u.key)
	m.Write([]byte(strings.Join(parts, "|")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession is a cookie value valid until now + sessionTTL.
func (u *UI) newSession(now time.Time) string {
	exp := strconv.FormatInt(now.Add(sessionTTL).Unix(), 10)
	return exp + "." + u.mac("session", exp)
}

// session reports the request's valid session cookie value, or "".
func (u *UI) session(r *http.Request) string {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return ""
	}
	exp, sig, ok := strings.Cut(c.Value, ".")
	if !ok {
		return ""
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || u.now().After(time.Unix(n, 0)) {
		return ""
	}
	if !hmac.Equal([]byte(sig), []byte(u.mac("session", exp))) {
		return ""
	}
	return c.Value
}

// csrfToken is the CSRF token of session value sess.
func (u *UI) csrfToken(sess string) string { return u.mac("csrf", sess) }

// csrfOK reports whether r carries the CSRF token of its session, in the
// form or the header.
func (u *UI) csrfOK(r *http.Request, sess string) bool {
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && hmac.Equal([]byte(got), []byte(u.csrfToken(sess)))
}

// tokenOK compares a login's token with the operator token in constant time.
func (u *UI) tokenOK(tok string) bool {
	return tok != "" && auth.EqualAny(tok, u.cfg.OperatorToken, u.cfg.PreviousOperatorToken)
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
