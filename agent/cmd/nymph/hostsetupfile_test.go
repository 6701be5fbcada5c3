package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dreamlake/lakeshore/shared/hostkey"
)

// TestHostSetupFile: --host-setup-file (or NYMPH_HOST_SETUP_FILE, what a
// provisioned host's user data sets) reads the exact command list, quotes
// and newlines included, so the host key is the one its work carries.
func TestHostSetupFile(t *testing.T) {
	required := []string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"}
	none := func(string) string { return "" }
	want := []string{`apt-get install -y "jq"`, "printf 'a\\nb'\nexit 0"}
	path := filepath.Join(t.TempDir(), "host-setup.json")
	if err := os.WriteFile(path, []byte(`["apt-get install -y \"jq\"", "printf 'a\\nb'\nexit 0"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := parseFlags(append(required, "--host-setup-file", path), none)
	if err != nil || !slices.Equal(c.HostSetup, want) || hostkey.Of(c.HostSetup) != hostkey.Of(want) {
		t.Fatalf("--host-setup-file: %q %v; want %q", c.HostSetup, err, want)
	}
	c, _, err = parseFlags(required, func(k string) string {
		if k == "NYMPH_HOST_SETUP_FILE" {
			return path
		}
		return ""
	})
	if err != nil || !slices.Equal(c.HostSetup, want) {
		t.Fatalf("NYMPH_HOST_SETUP_FILE: %q %v", c.HostSetup, err)
	}
	if _, _, err := parseFlags(append(required, "--host-setup-file", path, "--host-setup", "true"), none); err == nil {
		t.Error("both --host-setup-file and --host-setup accepted")
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"not": "a list"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseFlags(append(required, "--host-setup-file", bad), none); err == nil {
		t.Error("a file that is not a JSON list accepted")
	}
}
