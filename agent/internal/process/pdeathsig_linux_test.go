package process

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// runnerTestDaemon is the test binary as a daemon: it starts a body that
// would run for five minutes, writes the body's pid to
// $LAKESHORE_RUNNER_TEST_PIDFILE and waits to be killed.
func runnerTestDaemon() {
	r := New(Config{Workdir: os.Getenv("LAKESHORE_RUNNER_TEST_WORKDIR"), BaseEnv: runnerTestBaseEnv()})
	run := r.Start(wire.RunInvocation{InvocationID: "inv_PDEATHSIG", Attempt: 1, Argv: []string{"sleep", "300"}}, "wrk_test")
	<-run.Started()
	if err := os.WriteFile(os.Getenv("LAKESHORE_RUNNER_TEST_PIDFILE"), []byte(strconv.Itoa(run.Pid())+"\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	select {}
}

// TestRunnerBodyDiesWithTheDaemon: a daemon SIGKILLed with a body running
// takes the body with it (Pdeathsig), with nobody left to stop it.
func TestRunnerBodyDiesWithTheDaemon(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunnerHelperProcess$")
	cmd.Env = append(os.Environ(), runnerTestHelperEnv+"=daemon",
		"LAKESHORE_RUNNER_TEST_WORKDIR="+filepath.Join(dir, "work"), "LAKESHORE_RUNNER_TEST_PIDFILE="+pidFile)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	body := 0
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if body > 0 {
			_ = syscall.Kill(body, syscall.SIGKILL)
		}
	})
	body = proctest.Pid(t, pidFile)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	proctest.AssertGone(t, "the body of a SIGKILLed daemon", body)
}
