package agent

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// checkTransport refuses a plain-http control plane that is not on this
// host: the enrollment token and the worker token would cross the network
// in clear. insecure (--insecure) accepts it anyway, for a network the
// operator trusts (a VPC-internal load balancer, a test namespace).
func checkTransport(u *url.URL, insecure bool) error {
	if u.Scheme == "https" || insecure {
		return nil
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("--control-plane %s is plain http to another host: tokens would cross the network in clear; use https, or pass --insecure if this network is trusted", u.Redacted())
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

// RunAs is the account bodies run as (--run-as).
type RunAs struct {
	Name string
	Home string
	Cred *syscall.Credential
}

// LookupRunAs resolves --run-as USER (a name or a numeric uid) from the
// system's user database. Switching to another account needs root; naming
// the daemon's own account is allowed and changes nothing.
func LookupRunAs(name string, euid int) (*RunAs, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, convErr := strconv.Atoi(name); convErr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("--run-as %s: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--run-as %s: gid %q: %w", name, u.Gid, err)
	}
	if euid != 0 && uint64(euid) != uid {
		return nil, fmt.Errorf("--run-as %s: running bodies as another user needs root (nymph runs as uid %d)", name, euid)
	}
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && n != gid {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	// Without this the child keeps the daemon's supplementary groups
	// (root's, say) when Groups is empty.
	if cred.Groups == nil {
		cred.Groups = []uint32{}
	}
	return &RunAs{Name: u.Username, Home: u.HomeDir, Cred: cred}, nil
}

// reachable reports an error unless the --run-as account can search every
// directory from / down to dir (the workdir root): bodies start in run
// directories below it, and the kernel checks search permission on the way.
// dir itself need not exist yet (nymph creates it, then opens it up).
func (ra *RunAs) reachable(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("--run-as %s: %w", ra.Name, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		if ok && !canSearch(st.Uid, st.Gid, mode, ra.Cred) {
			return fmt.Errorf("--run-as %s: %s cannot reach --workdir %s: %s is mode %04o (owner %d); choose a workdir whose parents others may search (chmod o+x), e.g. /var/lib/nymph-work", ra.Name, ra.Name, dir, p, mode, st.Uid)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func canSearch(uid, gid uint32, mode os.FileMode, c *syscall.Credential) bool {
	switch {
	case uid == c.Uid:
		return mode&0o100 != 0
	case gid == c.Gid || slices.Contains(c.Groups, gid):
		return mode&0o010 != 0
	default:
		return mode&0o001 != 0
	}
}
