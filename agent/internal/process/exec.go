package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// ExecDrainWait bounds how long Exec waits for its output pipe to reach EOF
// once the command's process group is gone. Only a descendant that left the
// group (setsid) can still hold the pipe then, and it must not hang setup.
const ExecDrainWait = 2 * time.Second

// Exec runs argv to completion in dir, for setup commands: argv[0] is looked
// up in BaseEnv's PATH, the environment is BaseEnv alone, stdin is /dev/null,
// and the command leads its own process group, which is SIGKILLed once the
// command exits. outputTail is the last 4 KiB of stdout and stderr
// interleaved, as valid UTF-8. Cancelling ctx terminates the group (SIGTERM,
// KillAfter, SIGKILL).
//
// err is nil when the command ran to an end of its own, whatever its exit
// status; exitCode is then its status, or 128+signal if a signal killed it.
// err is non-nil when it could not start (exitCode -1) or when ctx ended it
// (err wraps ctx's error; exitCode is how it ended).
func (r *Runner) Exec(ctx context.Context, argv []string, dir string) (exitCode int, outputTail string, dur time.Duration, err error) {
	begin := r.cfg.Clock.Now()
	elapsed := func() time.Duration { return r.cfg.Clock.Since(begin) }
	if len(argv) == 0 {
		return -1, "", elapsed(), errors.New("exec: argv is empty")
	}
	if err := ctx.Err(); err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec %q: not started: %w", ClipString(argv[0], 200), err)
	}
	env := mergeEnv(r.cfg.BaseEnv)
	path, err := lookPathIn(argv[0], envValue(env, "PATH"))
	if err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return -1, "", elapsed(), fmt.Errorf("exec %q: output pipe: %w", ClipString(argv[0], 200), err)
	}
	tail := &tailBuffer{max: wire.MaxTailBytes}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(tail, pr)
	}()
	cmd := &exec.Cmd{Path: path, Args: slices.Clone(argv), Dir: dir, Env: env, Stdout: pw, Stderr: pw}
	res := r.runGroup(cmd, ctx.Done(), nil)
	if len(res.survivors) > 0 {
		r.log.Error("process group still has live processes after SIGKILL: cleanup not confirmed",
			"process", "exec", "pgid", res.pgid, "pids", res.survivors)
	}
	_ = pw.Close()
	drain := time.NewTimer(ExecDrainWait)
	select {
	case <-copied:
	case <-drain.C:
		r.log.Warn("exec output still open after its process group ended; a descendant left the group")
	}
	drain.Stop()
	_ = pr.Close() // unblocks the copy if a stray descendant still holds the pipe
	<-copied
	outputTail = tail.String()

	if res.startErr != nil {
		return -1, outputTail, elapsed(), fmt.Errorf("exec %q: %w", ClipString(argv[0], 200), res.startErr)
	}
	exitCode = res.exitCode()
	r.log.Debug("exec finished", "exit_code", exitCode, "terminated", res.terminated)
	if res.terminated {
		return exitCode, outputTail, elapsed(), fmt.Errorf("exec %q: terminated (%s): %w", ClipString(argv[0], 200), res.describe(), ctx.Err())
	}
	return exitCode, outputTail, elapsed(), nil
}

// lookPathIn finds file like a shell would, but in path (the body's PATH)
// rather than the daemon's. A name with a slash is used as given (relative to
// the body's directory). Empty and relative PATH entries are skipped: they
// would resolve against the daemon's working directory.
func lookPathIn(file, path string) (string, error) {
	if file == "" {
		return "", errors.New("argv[0] is empty")
	}
	if strings.Contains(file, "/") {
		return file, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, file)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %q", ClipString(file, 200), ClipString(path, 1000))
}
