package agent

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

// checkTransport refuses a plain-http control plane that is not on this
// host: the enrollment token and the worker token would cross the network
// in clear. insecure (--insecure) accepts it anyway, for a network the
// operator trusts (a VPC-internal load balancer, a test namespace).
func checkTransport(u *url.URL, insecure bool) error {
	if insecure || !inClearToAnotherHost(u) {
		return nil
	}
	return fmt.Errorf("--control-plane %s is plain http to another host: tokens would cross the network in clear; use https, or pass --insecure if this network is trusted", u.Redacted())
}

// checkWakeURL applies checkTransport's rule to the wake channel's URL
// that hello answers: nymph presents its worker token there, so it takes
// wss://, plain ws:// only to this host, or to any host with --insecure.
func checkWakeURL(raw string, insecure bool) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return fmt.Errorf("wake_url is not a ws:// or wss:// URL")
	}
	if insecure || !inClearToAnotherHost(u) {
		return nil
	}
	return fmt.Errorf("wake_url %s is plain ws to another host: the worker token would cross the network in clear; the control plane should hand out wss://, or pass --insecure if this network is trusted", u.Redacted())
}

// inClearToAnotherHost reports whether a request to u travels unencrypted
// (http, ws) to a host other than this one (localhost, a loopback IP).
func inClearToAnotherHost(u *url.URL) bool {
	if u.Scheme == "https" || u.Scheme == "wss" {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// ReadTokenFile reads a token from path (surrounding white space trimmed).
// The file must be a regular file that neither group nor others may read or
// write, as ssh insists for private keys: a token readable by every local
// user is a token every local process can enroll with.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("token file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("token file %s has mode %04o: it must not be readable by group or others (chmod 600 %s)", path, perm, path)
	}
	buf := make([]byte, 4097)
	n, err := f.Read(buf)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if n > 4096 {
		return "", fmt.Errorf("token file %s is over 4 KiB: not a token", path)
	}
	tok := strings.TrimSpace(string(buf[:n]))
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s must hold one token on one line", path)
	}
	return tok, nil
}
