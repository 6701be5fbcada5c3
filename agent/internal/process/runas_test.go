package process

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestLookupRunAs(t *testing.T) {
	ra, err := LookupRunAs("nobody", 0)
	if err != nil {
		t.Skipf("no nobody account here: %v", err)
	}
	if ra.Name != "nobody" || ra.Cred.Uid == 0 || ra.Cred.Groups == nil {
		t.Errorf("nobody: %+v %+v", ra, ra.Cred)
	}
	byID, err := LookupRunAs(strconv.FormatUint(uint64(ra.Cred.Uid), 10), 0)
	if err != nil || byID.Name != "nobody" {
		t.Errorf("by uid: %+v %v", byID, err)
	}
	if _, err := LookupRunAs("nobody", 1000); err == nil || !strings.Contains(err.Error(), "needs root") {
		t.Errorf("another user without root: %v", err)
	}
	if same, err := LookupRunAs("nobody", int(ra.Cred.Uid)); err != nil || same.Cred.Uid != ra.Cred.Uid {
		t.Errorf("its own account without root: %v", err)
	}
	if _, err := LookupRunAs("no-such-user-lakeshore", 0); err == nil {
		t.Error("an unknown user resolved")
	}
}

// TestHandOver: the run directory becomes the account's, the directories
// above it only searchable.
func TestHandOver(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	root := t.TempDir()
	dir := filepath.Join(root, "inv_x", "1")
	body := filepath.Join(dir, "sub", "deeper")
	if err := os.MkdirAll(body, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := handOver(root, dir, body, &syscall.Credential{Uid: 65534, Gid: 65534}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "sub"), body} {
		st, _ := os.Stat(p)
		if s := st.Sys().(*syscall.Stat_t); s.Uid != 65534 || s.Gid != 65534 {
			t.Errorf("%s owned by %d:%d", p, s.Uid, s.Gid)
		}
	}
	for _, p := range []string{root, filepath.Join(root, "inv_x")} {
		st, _ := os.Stat(p)
		if s := st.Sys().(*syscall.Stat_t); s.Uid != 0 || st.Mode().Perm() != 0o711 {
			t.Errorf("%s: owner %d mode %o, want root 0711", p, s.Uid, st.Mode().Perm())
		}
	}
}
