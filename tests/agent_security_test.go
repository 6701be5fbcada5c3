package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestAgentRefusesPlainHTTPToAnotherHost: tokens never cross a network in
// clear unless the operator says so; the refusal is at start (exit 2) with a
// message that says what to do.
func TestAgentRefusesPlainHTTPToAnotherHost(t *testing.T) {
	cmd := exec.Command(bin(t, "nymph"), "--control-plane", "http://192.0.2.10:3000", "--enroll-token", "e",
		"--queue", "q", "--workdir", t.TempDir(), "--state-dir", t.TempDir(), "--introspect-addr", "off")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "--insecure") {
		t.Fatalf("plain http to another host: %v\n%s", err, out)
	}
}

// TestAgentEnrollTokenFile: a token file others may read is refused; a
// 0600 one enrolls, and the token is not on the command line.
func TestAgentEnrollTokenFile(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "enroll-token")
	if err := os.WriteFile(tokenFile, []byte(d.EnrollToken+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	loose := exec.Command(bin(t, "nymph"), "--control-plane", d.URL, "--enroll-token-file", tokenFile,
		"--queue", "q", "--workdir", t.TempDir(), "--state-dir", t.TempDir(), "--introspect-addr", "off")
	if out, err := loose.CombinedOutput(); err == nil || !strings.Contains(string(out), "chmod 600") {
		t.Fatalf("a 0644 token file: %v\n%s", err, out)
	}
	if err := os.Chmod(tokenFile, 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNymphWithoutToken(t, d, "token-file", dir, nil, "--enroll-token-file", tokenFile)
	inv := submitSh(t, d.Operator(), `echo ran`, 0)
	if got := waitTerminal(t, d.Operator(), inv.InvocationID, 30*time.Second); got.State != wire.StateSucceeded {
		t.Fatalf("work through a token-file worker: %+v", got)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", n.cmd.Process.Pid))
	if strings.Contains(string(cmdline), d.EnrollToken) {
		t.Fatal("the enrollment token is on nymph's command line")
	}
}

// startNymphWithoutToken runs bin/nymph with the pinned flags but no
// --enroll-token, as the given extra flags and env say.
func startNymphWithoutToken(t *testing.T, d *devServer, machine, dir string, env []string, extra ...string) *nymphProc {
	t.Helper()
	return startNymphRaw(t, machine, dir, nil, append([]string{"--control-plane", d.URL, "--queue", "q"}, extra...), env)
}

// startNymphRaw runs bin/nymph with exactly args (plus the test defaults
// for machine, dirs and timings) and env added to the test's environment;
// cred, if set, runs it as another user.
func startNymphRaw(t *testing.T, machine, dir string, cred *syscall.Credential, args, env []string) *nymphProc {
	t.Helper()
	args = append(args, "--label", machine, "--machine-id", machine, "--workdir", filepath.Join(dir, "work"),
		"--state-dir", filepath.Join(dir, "state"), "--introspect-addr", "off", "--grace", "5s", "--kill-after", "1s",
		"--log-level", "debug")
	nymph := bin(t, "nymph")
	if cred != nil {
		// The test binaries live in a 0700 directory of root's.
		nymph = filepath.Join(dir, "nymph")
		data, err := os.ReadFile(bin(t, "nymph"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nymph, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return launchNymph(t, machine, append([]string{nymph}, args...), env, cred)
}

// searchableTempDir is t.TempDir() with it and its parent searchable (not
// readable) by other users, as a --run-as user's workdir must be.
func searchableTempDir(t *testing.T) string {
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// envProbe is a body that prints its whole environment, then what it could
// read of the daemon's: its parent's /proc environ and memory map, the
// daemon's state directory.
const envProbe = `env; echo "--- daemon environ:"; { tr '\0' '\n' < /proc/$PPID/environ; } 2>&1 | head -c 2000;` +
	` echo "--- state dir:"; ls "$STATE_DIR" 2>&1; echo "--- id: $(id -u)"`

// TestAgentBodyEnvironmentHoldsNoSecrets: a body's environment holds none
// of the daemon's secrets (the enrollment token given by environment, the
// worker token, cloud credentials, anything else of the daemon's), only
// what its run config gives plus the variables named by --pass-env; and a
// body of the daemon's own user cannot read the daemon's environment
// through /proc either (nymph is not dumpable).
func TestAgentBodyEnvironmentHoldsNoSecrets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs nymph as nobody, which needs root (CI runs as root)")
	}
	d := startDev(t, backends[0], "--stale-after", "3s")
	dir := searchableTempDir(t)
	for _, p := range []string{dir, filepath.Join(dir, "work"), filepath.Join(dir, "state")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	secrets := []string{d.EnrollToken, "AKIAEXAMPLESECRET", "daemon-only-value"}
	startNymphRaw(t, "no-secrets", dir, &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}},
		[]string{"--control-plane", d.URL, "--queue", "q", "--pass-env", "ALLOWED_FOR_BODIES"},
		[]string{"NYMPH_ENROLL_TOKEN=" + d.EnrollToken, "AWS_SECRET_ACCESS_KEY=AKIAEXAMPLESECRET",
			"DAEMON_ONLY=daemon-only-value", "ALLOWED_FOR_BODIES=passed"})

	op := d.Operator()
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q", Argv: []string{"sh", "-c", envProbe},
		Env: map[string]string{"STATE_DIR": filepath.Join(dir, "state"), "FROM_RUN_CONFIG": "given"}})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTerminal(t, op, inv.InvocationID, 30*time.Second)
	out := got.StdoutTail
	if got.State != wire.StateSucceeded || !strings.Contains(out, "--- id: 65534") {
		t.Fatalf("probe: %+v", got)
	}
	body, daemonView, _ := strings.Cut(out, "--- daemon environ:")
	for _, want := range []string{"FROM_RUN_CONFIG=given", "ALLOWED_FOR_BODIES=passed", "NYMPH_INVOCATION_ID=" + inv.InvocationID} {
		if !strings.Contains(body, want) {
			t.Errorf("body environment lacks %s:\n%s", want, body)
		}
	}
	for _, s := range append(secrets, "wtk_", "NYMPH_ENROLL", "DAEMON_ONLY") {
		if strings.Contains(out, s) {
			t.Errorf("a body saw the daemon's %q:\n%s", s, out)
		}
	}
	if !strings.Contains(daemonView, "Permission denied") {
		t.Errorf("a body of the daemon's own user read the daemon's /proc environ:\n%s", daemonView)
	}
}

// TestAgentRunAsNeedsAReachableWorkdir: a workdir the --run-as user cannot
// reach is refused at start, not at every invocation.
func TestAgentRunAsNeedsAReachableWorkdir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--run-as needs root (CI runs as root)")
	}
	hidden := t.TempDir() // 0700, root's
	cmd := exec.Command(bin(t, "nymph"), "--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q",
		"--workdir", filepath.Join(hidden, "work"), "--state-dir", t.TempDir(), "--introspect-addr", "off", "--run-as", "nobody")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "cannot reach") {
		t.Fatalf("unreachable workdir: %v\n%s", err, out)
	}
}

// TestAgentRunAs: with --run-as, bodies and their run_setup run as that
// user, in a run directory of theirs, and cannot read the daemon's state
// (its spool) or its environment; their result file still comes back.
func TestAgentRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--run-as needs root (CI runs as root)")
	}
	d := startDev(t, backends[0], "--stale-after", "3s")
	dir := searchableTempDir(t)
	startNymphIn(t, d, "run-as", dir, "--run-as", "nobody")
	op := d.Operator()
	inv, _, err := op.Submit(context.Background(), wire.SubmitRequest{Queue: "q",
		Argv:      []string{"sh", "-c", envProbe + `; echo '{"uid": '$(id -u)'}' > "$NYMPH_RESULT_FILE"; touch ../planted 2>&1 || true`},
		Env:       map[string]string{"STATE_DIR": filepath.Join(dir, "state")},
		RunConfig: wire.RunConfig{RunSetup: []string{`test "$(id -u)" = 65534`}}})
	if err != nil {
		t.Fatal(err)
	}
	got := waitTerminal(t, op, inv.InvocationID, 30*time.Second)
	if got.State != wire.StateSucceeded || string(got.ResultBlob) != `{"uid":65534}` {
		t.Fatalf("run as nobody: %+v (stdout %q)", got, got.StdoutTail)
	}
	_, after, _ := strings.Cut(got.StdoutTail, "--- daemon environ:")
	daemonView, stateView, _ := strings.Cut(after, "--- state dir:")
	if !strings.Contains(daemonView, "Permission denied") || !strings.Contains(stateView, "Permission denied") {
		t.Errorf("a --run-as body read the daemon's environ or state dir:\n%s", got.StdoutTail)
	}
	if _, err := os.Stat(filepath.Join(dir, "work", inv.InvocationID, "planted")); err == nil {
		t.Error("a --run-as body wrote into the invocation directory above its own")
	}
	if home := "HOME=/nonexistent"; !strings.Contains(got.StdoutTail, home) {
		t.Errorf("body HOME is not nobody's:\n%s", got.StdoutTail)
	}
}
