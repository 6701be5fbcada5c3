package agent

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/agent/internal/process"
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

// TestCheckWakeURL: the wake channel's URL follows the control plane's
// rule: wss://, or plain ws:// to this host, or plain anywhere with
// --insecure; anything but a ws(s) URL is refused.
func TestCheckWakeURL(t *testing.T) {
	for _, tc := range []struct {
		url      string
		insecure bool
		ok       bool
	}{
		{"wss://abc.execute-api.us-east-1.amazonaws.com/wake", false, true},
		{"ws://127.0.0.1:3000/wake", false, true},
		{"ws://[::1]:3000/wake", false, true},
		{"ws://localhost:3000/wake", false, true},
		{"ws://evil.example:1/", false, false},
		{"ws://10.0.0.1:3000/wake", false, false},
		{"ws://localhost.evil.example/wake", false, false},
		{"ws://0.0.0.0:3000/wake", false, false},
		{"ws://user:secret@10.0.0.1/wake", false, false},
		{"ws://evil.example:1/", true, true},
		{"https://cp.example.com/wake", false, false},
		{"http://127.0.0.1:3000/wake", true, false},
		{"wss:///wake", false, false},
		{"::not a url", true, false},
	} {
		err := checkWakeURL(tc.url, tc.insecure)
		if (err == nil) != tc.ok {
			t.Errorf("checkWakeURL(%s, insecure=%v) = %v, want ok=%v", tc.url, tc.insecure, err, tc.ok)
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

// TestPassEnv: --pass-env carries named variables of the daemon's own
// environment into bodies; NYMPH_ settings never pass.
func TestPassEnv(t *testing.T) {
	env := map[string]string{"PATH": "/bin", "FOO": "1", "NYMPH_ENROLL_TOKEN": "secret", "BAR": "2"}
	got := strings.Join(process.DefaultBaseEnv(func(k string) string { return env[k] }, "FOO", "PATH"), " ")
	if got != "PATH=/bin FOO=1" {
		t.Errorf("DefaultBaseEnv with --pass-env FOO = %q", got)
	}
	cfg := Config{ControlPlane: "http://127.0.0.1:1", EnrollToken: "e", Queue: "q", Workdir: "w", StateDir: "s", PassEnv: []string{"NYMPH_ENROLL_TOKEN"}}
	if _, err := cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), "never reach a body") {
		t.Errorf("--pass-env NYMPH_ENROLL_TOKEN: %v", err)
	}
}
