package process

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

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

// Reachable reports an error unless the --run-as account can search every
// directory from / down to dir (the workdir root): bodies start in run
// directories below it, and the kernel checks search permission on the way.
// dir itself need not exist yet (nymph creates it, then opens it up).
func (ra *RunAs) Reachable(dir string) error {
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
