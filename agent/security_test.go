package agent

import (
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestCheckTransport(t *testing.T) {
	for _, tc := range []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"https://cp.example.com", false, true},
		{"http://127.0.0.1:3000", false, true},
		{"http://127.8.9.10", false, true},
		{"http://[::1]:3000", false, true},
		{"http://localhost:3000", false, true},
		{"http://LOCALHOST", false, true},
		{"http://10.0.0.1:3000", false, false},
		{"http://cp.example.com", false, false},
		{"http://localhost.example.com", false, false},
		{"http://0.0.0.0:3000", false, false},
		{"http://user:secret@10.0.0.1", false, false},
		{"http://10.0.0.1:3000", true, true},
	} {
		u, _ := url.Parse(tc.url)
		err := checkTransport(u, tc.insecure)
		if (err == nil) != tc.ok {
			t.Errorf("checkTransport(%s, insecure=%v) = %v, want ok=%v", tc.url, tc.insecure, err, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error shows the URL's password: %v", err)
		}
	}
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := ReadTokenFile(write("ok", "  tok-123\n", 0o600)); err != nil || tok != "tok-123" {
		t.Errorf("0600 file: %q, %v", tok, err)
	}
	if tok, err := ReadTokenFile(write("ro", "tok\n", 0o400)); err != nil || tok != "tok" {
		t.Errorf("0400 file: %q, %v", tok, err)
	}
	for name, tc := range map[string]struct {
		content string
		mode    os.FileMode
		want    string
	}{
		"group-readable": {"tok", 0o640, "chmod 600"},
		"world-readable": {"tok", 0o644, "chmod 600"},
		"empty":          {"\n", 0o600, "one token"},
		"two lines":      {"a\nb\n", 0o600, "one token"},
		"huge":           {strings.Repeat("x", 5000), 0o600, "over 4 KiB"},
	} {
		_, err := ReadTokenFile(write(name, tc.content, tc.mode))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	if _, err := ReadTokenFile(dir); err == nil {
		t.Error("a directory was read as a token file")
	}
	if _, err := ReadTokenFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file gave a token")
	}
}

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

// TestPassEnv: --pass-env carries named variables of the daemon's own
// environment into bodies; NYMPH_ settings never pass.
func TestPassEnv(t *testing.T) {
	env := map[string]string{"PATH": "/bin", "FOO": "1", "NYMPH_ENROLL_TOKEN": "secret", "BAR": "2"}
	got := strings.Join(DefaultBaseEnv(func(k string) string { return env[k] }, "FOO", "PATH"), " ")
	if got != "PATH=/bin FOO=1" {
		t.Errorf("DefaultBaseEnv with --pass-env FOO = %q", got)
	}
	cfg := Config{ControlPlane: "http://127.0.0.1:1", EnrollToken: "e", Queue: "q", Workdir: "w", StateDir: "s", PassEnv: []string{"NYMPH_ENROLL_TOKEN"}}
	if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "never reach a body") {
		t.Errorf("--pass-env NYMPH_ENROLL_TOKEN: %v", err)
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
