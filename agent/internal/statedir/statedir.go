// Package statedir makes the daemon's private directories under
// --state-dir (the ack spool, the body ledger): owner-only, and never a
// symlink that could point what they hold (worker tokens, pids to kill)
// somewhere else.
package statedir

import (
	"fmt"
	"os"
	"path/filepath"
)

// Private creates parent/name if needed and reports its path. It refuses
// an entry there that is not a plain directory (Lstat: a symlink is
// refused), and makes the directory mode 0700: MkdirAll leaves an existing
// directory's mode alone, and a new one is subject to the umask.
func Private(parent, name string) (string, error) {
	dir := filepath.Join(parent, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", fmt.Errorf("tighten %s: %w", dir, err)
		}
	}
	return dir, nil
}
