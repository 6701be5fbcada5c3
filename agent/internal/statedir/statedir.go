// Package statedir makes the daemon's private directories under
// --state-dir (the ack spool, the body ledger): owner-only, and never a
// symlink that could point what they hold (worker tokens, pids to kill)
// somewhere else.
package statedir

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
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

// ReadJSON decodes the JSON file at path, of at most max bytes, into v. It
// never follows a symlink (O_NOFOLLOW): the file names in these
// directories are the daemon's, and so must be what they hold.
func ReadJSON(path string, max int64, v any) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > max {
		return fmt.Errorf("larger than %d bytes", max)
	}
	return json.Unmarshal(b, v)
}
