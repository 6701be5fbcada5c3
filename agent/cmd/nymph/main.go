// Command nymph is the on-host agent: it enrolls with the control plane,
// heartbeats, runs queued invocations and exits cleanly on a signal, an idle
// timeout or a drain command. Every flag may also be set as NYMPH_<FLAG> in
// upper snake case (NYMPH_CONTROL_PLANE, NYMPH_ENROLL_TOKEN, …).
//
// Inside a body, `nymph publish PATH [--name NAME]` publishes a file or
// directory of the run as an artifact of its attempt (publish.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/shared/logjson"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Getenv))
}

func run(args []string, getenv func(string) string) int {
	return runIO(args, getenv, os.Stdout, os.Stderr)
}

// runIO is run with its output streams: help and --version go to stdout,
// errors and the log to stderr.
func runIO(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "publish" {
		return runPublish(args[1:], stdout, stderr)
	}
	if len(args) == 0 && getenv("NYMPH_CONTROL_PLANE") == "" {
		// A bare nymph: say how to run it rather than what is missing.
		fmt.Fprintln(stderr, "usage: nymph --control-plane URL --enroll-token T --queue Q [flags]  (nymph --help lists them)")
		return agent.ExitUsage
	}
	cfg, logLevel, err := parseFlagsTo(args, getenv, stdout)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		return agent.ExitOK
	case errors.Is(err, errVersion):
		fmt.Fprintln(stdout, "nymph", version)
		return agent.ExitOK
	case err != nil:
		fmt.Fprintln(stderr, "nymph:", err)
		return agent.ExitUsage
	}
	log := logjson.New(stderr, logLevel)
	if err := agent.HideFromSameUser(); err != nil {
		log.Warn("cannot mark nymph non-dumpable: bodies of its own user could read its environment", "error", err.Error())
	}
	cfg.Logger = log
	cfg.Version = version
	a, err := agent.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "nymph:", err)
		return agent.ExitUsage
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for range sigs {
			a.Stop() // first: drain; second: skip the grace
		}
	}()
	// 0 after a drain, 1 a failure a restart may cure (the control plane
	// unreachable through hello's retries, say), 3 a refused hello, 4 a host
	// setup nobody repaired (agent/exitcodes.go).
	err = a.Run(context.Background())
	if err != nil {
		log.Error("nymph stopped", "error", err.Error(), "exit_code", agent.ExitCode(err))
	}
	return agent.ExitCode(err)
}

// parseFlags reads the pinned flags (docs/design.md §6), each also from
// NYMPH_<FLAG>. What neither sets keeps agent.DefaultConfig's value; an explicit zero
// (--grace 0s, NYMPH_KILL_AFTER=0s) is zero.
func parseFlags(args []string, getenv func(string) string) (agent.Config, slog.Level, error) {
	return parseFlagsTo(args, getenv, io.Discard)
}

// errVersion is parseFlagsTo's answer to --version.
var errVersion = errors.New("version asked")

// parseFlagsTo is parseFlags printing --help to out.
func parseFlagsTo(args []string, getenv func(string) string, out io.Writer) (agent.Config, slog.Level, error) {
	c := agent.DefaultConfig()
	def := agent.DefaultConfig()
	var tags []string
	var level string
	var showVersion bool
	fs := pflag.NewFlagSet("nymph", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&showVersion, "version", false, "print nymph's version and exit")
	fs.StringVar(&c.ControlPlane, "control-plane", "", "control plane URL (required)")
	fs.StringVar(&c.EnrollToken, "enroll-token", "", "enrollment token (required)")
	fs.StringVar(&c.Queue, "queue", "", "queue to serve (required)")
	fs.StringVar(&c.Label, "label", "", "human label for this worker")
	fs.StringArrayVar(&tags, "tag", nil, "tag k=v (repeatable)")
	fs.IntVar(&c.Capacity, "capacity", def.Capacity, "invocations run at once")
	fs.StringVar(&c.Workdir, "workdir", def.Workdir, "root of the invocations' working directories")
	fs.StringVar(&c.StateDir, "state-dir", def.StateDir, "where acks are spooled across restarts")
	fs.DurationVar(&c.KeepAlive, "keep-alive", def.KeepAlive, "exit after this long idle (0: never)")
	fs.DurationVar(&c.Grace, "grace", def.Grace, "how long in-flight work may finish after a drain starts (0: none, terminate at once)")
	fs.DurationVar(&c.KillAfter, "kill-after", def.KillAfter, "wait between SIGTERM and SIGKILL of a body (0: SIGKILL right after SIGTERM)")
	fs.StringArrayVar(&c.HostSetup, "host-setup", nil, "shell command run once at boot before taking work (repeatable)")
	var hostSetupFile string
	fs.StringVar(&hostSetupFile, "host-setup-file", "", "read the host setup commands from this JSON list of strings (what a provisioned host's user data writes); not with --host-setup")
	fs.BoolVar(&c.AdoptHostSetup, "adopt-host-setup", false, "a generic worker (no host setup) that, idle, may be asked to run queued work's host_setup and take on its host key (docs/provision.md)")
	fs.StringVar(&c.IntrospectAddr, "introspect-addr", def.IntrospectAddr, "loopback address for /status, /readyz, /livez (\"off\" disables)")
	fs.StringVar(&c.LifecycleAddr, "lifecycle-addr", def.LifecycleAddr, "loopback address of the endpoint bodies read their lifecycle at (NYMPH_LIFECYCLE_URL; port 0: any free one; \"off\" disables)")
	fs.DurationVar(&c.WarmKeepAlive, "warm-keep-alive", def.WarmKeepAlive, "how long a resident body's idle warm process is kept (run_config.resident; docs/warm.md)")
	fs.StringVar(&c.MachineID, "machine-id", "", "machine id (default: EC2 instance id, /etc/machine-id, hostname)")
	fs.DurationVar(&c.PollInterval, "poll-interval", def.PollInterval, "poll interval (0: what the control plane answers)")
	fs.DurationVar(&c.KeepRuns, "keep-runs", def.KeepRuns, "keep a finished run's directory this long after it ended (0: remove it once its ack is answered)")
	fs.Var(byteSizeValue{&c.KeepRunsSize}, "keep-runs-size", "cap on all run directories together, e.g. 500MB or 2GiB: past it finished ones go, oldest first (0: no cap)")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	var tokenFile string
	fs.StringVar(&tokenFile, "enroll-token-file", "", "read the enrollment token from this file (mode 0600 or stricter); keeps it out of the process list")
	fs.BoolVar(&c.Insecure, "insecure", false, "allow a plain http:// control plane on another host (tokens then cross the network in clear)")
	fs.StringVar(&c.RunAs, "run-as", "", "run bodies and their run_setup as this user (needs root); default: nymph's own user")
	fs.StringArrayVar(&c.PassEnv, "pass-env", nil, "name of a variable of nymph's environment that bodies get too (repeatable); NYMPH_* never pass")
	fs.BoolVar(&c.IAM, "iam", false, "sign requests with the EC2 instance role (SigV4, for API Gateway's AWS_IAM authorizer); the token moves to X-Lakeshore-Token")
	fs.StringVar(&c.IAMRegion, "iam-region", "", "region --iam signs for (default: an execute-api control plane's, else the instance's from IMDS)")
	fs.StringVar(&c.OnRebalance, "on-rebalance", def.OnRebalance, "what an EC2 rebalance recommendation does: drain (no more claims, bye drain) or log")
	if err := fs.Parse(args); err != nil {
		return c, 0, err
	}
	if showVersion {
		return c, 0, errVersion
	}
	// NYMPH_<FLAG> fills every flag the command line left unset.
	var envErr error
	fs.VisitAll(func(f *pflag.Flag) {
		env := "NYMPH_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v := getenv(env)
		if f.Changed || v == "" || envErr != nil {
			return
		}
		for _, part := range splitEnvList(f, v) {
			if err := f.Value.Set(part); err != nil {
				envErr = fmt.Errorf("%s: %w", env, err)
				return
			}
		}
	})
	if envErr != nil {
		return c, 0, envErr
	}
	if c.Capacity < 1 || c.Capacity > wire.MaxConcurrency {
		// An explicit 0 is refused like -1: it would not mean "none".
		return c, 0, fmt.Errorf("--capacity must be 1-%d, got %d", wire.MaxConcurrency, c.Capacity)
	}
	if hostSetupFile != "" {
		if len(c.HostSetup) > 0 {
			return c, 0, fmt.Errorf("give the host setup once: --host-setup or --host-setup-file, not both")
		}
		cmds, err := readHostSetupFile(hostSetupFile)
		if err != nil {
			return c, 0, err
		}
		c.HostSetup = cmds
	}
	if c.AdoptHostSetup && len(c.HostSetup) > 0 {
		return c, 0, fmt.Errorf("--adopt-host-setup is for a generic worker: not with --host-setup or --host-setup-file (that worker already has its host key)")
	}
	if tokenFile != "" {
		if c.EnrollToken != "" {
			return c, 0, fmt.Errorf("give the enrollment token once: --enroll-token or --enroll-token-file, not both")
		}
		tok, err := agent.ReadTokenFile(tokenFile)
		if err != nil {
			return c, 0, err
		}
		c.EnrollToken = tok
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return c, 0, fmt.Errorf("--log-level: %w", err)
	}
	if len(tags) > 0 {
		c.Tags = map[string]string{}
		for _, t := range tags {
			k, v, ok := strings.Cut(t, "=")
			if !ok || k == "" {
				return c, 0, fmt.Errorf("--tag must be k=v, got %q", t)
			}
			c.Tags[k] = v
		}
	}
	return c, lvl, nil
}

// splitEnvList splits a repeatable flag's env value on newlines (a shell
// command may hold commas); other flags take the value whole.
func splitEnvList(f *pflag.Flag, v string) []string {
	if f.Value.Type() == "stringArray" {
		return strings.Split(v, "\n")
	}
	return []string{v}
}

// maxHostSetupFile bounds a --host-setup-file.
const maxHostSetupFile = 1 << 20

// readHostSetupFile reads a JSON list of shell commands: the exact list a
// run config's host_setup holds, so the host key nymph derives from it is
// the one its work was queued under (docs/provision.md).
func readHostSetupFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--host-setup-file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxHostSetupFile+1))
	if err != nil {
		return nil, fmt.Errorf("--host-setup-file: %w", err)
	}
	if len(b) > maxHostSetupFile {
		return nil, fmt.Errorf("--host-setup-file %s is over %d bytes", path, maxHostSetupFile)
	}
	var cmds []string
	if err := json.Unmarshal(b, &cmds); err != nil {
		return nil, fmt.Errorf("--host-setup-file %s: want a JSON list of shell commands: %w", path, err)
	}
	return cmds, nil
}
