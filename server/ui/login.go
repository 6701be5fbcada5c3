package ui

import (
	"math"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/server/auth"
)

// Failed logins are throttled: a client address may fail loginsPerAddr
// times a minute, all clients together loginsInAll; past either, a login
// is answered 429 with Retry-After before its token is even compared, so
// the answer says nothing of a guess. The counts are this process's (an
// api instance's, on AWS, where API Gateway's throttling bounds the rest).
const (
	loginWindow   = time.Minute
	loginsPerAddr = 5
	loginsInAll   = 50
)

// loginLimits are the failed-login throttles and the warn line's limit.
type loginLimits struct {
	perAddr, inAll auth.Limiter
	// warn lets one warn line a minute tell of refused logins; the rest
	// go at debug, counted in the next warning.
	warn auth.Limiter
}

func newLoginLimits() *loginLimits {
	return &loginLimits{perAddr: auth.Limiter{Every: loginWindow, Max: loginsPerAddr},
		inAll: auth.Limiter{Every: loginWindow, Max: loginsInAll}, warn: auth.Limiter{Every: loginWindow, Max: 1}}
}

// wait reports how long addr must wait before its next login: 0 if none.
func (l *loginLimits) wait(addr string, now time.Time) time.Duration {
	return max(l.perAddr.Wait(addr, now), l.inAll.Wait("", now))
}

// failed counts a failed login from addr.
func (l *loginLimits) failed(addr string, now time.Time) {
	l.perAddr.Note(addr, now)
	l.inAll.Note("", now)
}

// clientAddr is the address r came from, as the API sees it (on AWS,
// lambdahttp sets RemoteAddr to API Gateway's source IP): an IPv4 address,
// or an IPv6 address's /64, which one client holds whole.
func clientAddr(r *http.Request) string {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return host
}

func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	now, addr := u.now(), clientAddr(r)
	if wait := u.logins.wait(addr, now); wait > 0 {
		secs := strconv.Itoa(int(math.Ceil(wait.Seconds())))
		u.refusedLogin(r, addr, now, "throttled")
		w.Header().Set("Retry-After", secs)
		u.render(w, http.StatusTooManyRequests, "login.html", map[string]any{"Error": "Too many failed logins: try again in " + secs + " s."})
		return
	}
	fp, ok := u.acceptedFingerprint(r.PostFormValue("token"))
	if !ok {
		u.logins.failed(addr, now)
		u.refusedLogin(r, addr, now, "wrong token")
		u.render(w, http.StatusUnauthorized, "login.html", map[string]any{"Error": "That is not the operator token."})
		return
	}
	secret, err := u.newSession(r.Context(), fp, now)
	if err != nil {
		u.log.Error("ui: login", "error", err.Error())
		u.render(w, http.StatusServiceUnavailable, "login.html", map[string]any{"Error": "The session could not be stored; try again."})
		return
	}
	setSession(w, r, secret, now.Add(sessionTTL))
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// refusedLogin logs a refused login: at warn once a minute, with how many
// were refused since the last warning, and at debug otherwise.
func (u *UI) refusedLogin(r *http.Request, addr string, now time.Time, why string) {
	if ok, held := u.logins.warn.Note("login", now); ok {
		u.log.Warn("ui: refused a login", "why", why, "remote", addr, "user_agent", r.UserAgent(), "refused_since_last_warning", held)
		return
	}
	u.log.Debug("ui: refused a login", "why", why, "remote", addr)
}

// logout ends the session in the store, for every copy of its cookie, and
// clears the browser's.
func (u *UI) logout(w http.ResponseWriter, r *http.Request, secret string) {
	if err := u.cfg.Sessions.EndUISession(r.Context(), sessionID(secret)); err != nil {
		u.log.Error("ui: logout", "error", err.Error())
		http.Error(w, "logout: the session could not be ended; try again", http.StatusServiceUnavailable)
		return
	}
	setSession(w, r, "", time.Time{})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// back is the page an action's form says it came from, or def: a path of
// the view only, cleaned (no step out of /ui/), of the characters the
// view's own paths use (no backslash, no escape a browser would read as
// another path), and the query of a filtered or paged list (the fleet
// page's queue, state, id and cursors: names, values and separators only,
// no escapes), so an action taken from a page of the list returns to it.
func back(r *http.Request, def string) string {
	to, query, hasQuery := strings.Cut(r.PostFormValue("back"), "?")
	if to == "" || !strings.HasPrefix(to, Prefix) || strings.IndexFunc(to, notPathChar) >= 0 ||
		strings.IndexFunc(query, notQueryChar) >= 0 {
		return def
	}
	clean := path.Clean(to)
	if strings.HasSuffix(to, "/") {
		clean += "/"
	}
	if !strings.HasPrefix(clean, Prefix) {
		return def
	}
	if hasQuery {
		v, err := url.ParseQuery(query)
		if err != nil {
			return def
		}
		if q := v.Encode(); q != "" {
			clean += "?" + q
		}
	}
	return clean
}

// notQueryChar reports whether c is not among the characters of the
// view's own list queries: names, values (queue names, states, id
// prefixes, base64url cursors, minutes) and their separators.
func notQueryChar(c rune) bool {
	return notPathChar(c) && !strings.ContainsRune("=&", c) || c == '/'
}

// notPathChar reports whether c is not among the characters of the view's
// own paths (ids are ULIDs with a prefix).
func notPathChar(c rune) bool {
	return !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("/_-.", c))
}
