package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Defaults and environment of the client commands (docs/design.md §8).
const (
	defaultURL = "http://127.0.0.1:3000"
	envURL     = "LAKESHORE_URL"
	envToken   = "LAKESHORE_TOKEN"
)

// Output formats of --output.
const (
	outputText = "text"
	outputJSON = "json"
)

// clientOptions are the flags every client command shares.
type clientOptions struct {
	url    string
	token  string
	output string
}

// register adds the shared flags to cmd as persistent flags, so a parent
// such as `ls` hands them to its subcommands. The environment is read when
// the command runs, not here, so the token never shows up as a default in
// --help.
func (o *clientOptions) register(cmd *cobra.Command) {
	o.registerTarget(cmd)
	cmd.PersistentFlags().StringVarP(&o.output, "output", "o", outputText, "output format: text or json")
}

// registerTarget adds --url and --token alone, for a command whose
// subcommands give -o another meaning (artifacts get -o PATH).
func (o *clientOptions) registerTarget(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&o.url, "url", "", "control plane URL (env "+envURL+", default "+defaultURL+")")
	f.StringVar(&o.token, "token", "", "operator token (env "+envToken+"; lakeshore dev prints one)")
}

// client checks the shared flags and returns a client for them.
func (o *clientOptions) client() (*client.Client, error) {
	if o.output != outputText && o.output != outputJSON {
		return nil, fmt.Errorf("--output must be text or json, got %q", o.output)
	}
	url := o.url
	if url == "" {
		url = os.Getenv(envURL)
	}
	if url == "" {
		url = defaultURL
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("--url must start with http:// or https://, got %q", url)
	}
	token := o.token
	if token == "" {
		token = os.Getenv(envToken)
	}
	if token == "" {
		return nil, fmt.Errorf("no operator token: pass --token or set %s (`lakeshore dev` prints it)", envToken)
	}
	return client.New(url, token, client.WithUserAgent("lakeshore-cli/1")), nil
}

func (o *clientOptions) json() bool { return o.output == outputJSON }

// addClientCommands adds the operator API client commands (submit, get,
// logs, ls, cancel, drain, setup, watch, release-hold, run).
func addClientCommands(root *cobra.Command) {
	o := &clientOptions{}
	for _, cmd := range []*cobra.Command{
		newSubmitCmd(o),
		newGetCmd(o),
		newLogsCmd(o),
		newLsCmd(o),
		newCancelCmd(o),
		newDrainCmd(o),
		newSetupCmd(o),
		newWatchCmd(o),
		newReleaseHoldCmd(o),
		newRunCmd(o),
	} {
		o.register(cmd)
		root.AddCommand(cmd)
	}
}

type submitOptions struct {
	queue          string
	hostSetup      []string
	runSetup       []string
	env            []string
	workdir        string
	timeout        time.Duration
	maxAttempts    int
	idempotencyKey string
	retryCodes     []int
	retryTimeout   bool
	retryBackoff   time.Duration
	drainSignal    string
	requeueCodes   []int
	resident       bool
	input          string
	wait           bool
	logs           bool
	waitTimeout    time.Duration
}

func newSubmitCmd(o *clientOptions) *cobra.Command {
	var s submitOptions
	cmd := &cobra.Command{
		Use:   "submit [flags] -- ARGV...",
		Short: "Queue an invocation: a command and its run config",
		Long: `Queue an invocation of ARGV on a queue and print its id. Flags end at the
first argument (or at --), so the command's own flags need no quoting:

  lakeshore submit --queue gpu --env SEED=1 -- python train.py --epochs 3

A failing body runs again only when asked: --retry-exit-code N (and
--retry-timeout) retry such a failure after a backoff, within --max-attempts.
Without them only attempts whose worker was lost run again.

--host-setup commands select the host: only a worker started with the same
--host-setup list (the same host key) runs the invocation. --run-setup
commands run in the invocation's workdir before ARGV.

When its worker drains (a stop, a spot notice, keep-alive), a body hears
it inside the grace window on its lifecycle endpoint (NYMPH_LIFECYCLE_URL),
and by --drain-signal if set; it is handed back to the queue instead of
recorded when it asks there, or exits with a --requeue-exit-code status
(docs/lifecycle.md).

With --wait, follow the invocation until it finishes (progress on stderr) and
exit non-zero unless it succeeded; --logs also prints its output as it runs.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSubmit(cmd, o, s, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	s.registerJobFlags(f)
	f.StringVar(&s.idempotencyKey, "idempotency-key", "", "submitting the same key again returns the first invocation")
	f.BoolVarP(&s.wait, "wait", "w", false, "wait until the invocation finishes; exit 1 unless it succeeded")
	f.BoolVar(&s.logs, "logs", false, "with --wait, print the invocation's output as it runs (lakeshore logs --follow)")
	f.DurationVar(&s.waitTimeout, "wait-timeout", 0, "give up waiting after this long (0: wait until interrupted)")
	return cmd
}

// registerJobFlags adds the flags that say how a job runs and where:
// submit's, and run submit's as every job's defaults.
func (s *submitOptions) registerJobFlags(f *pflag.FlagSet) {
	f.StringVarP(&s.queue, "queue", "q", "default", "queue to submit to")
	f.StringArrayVar(&s.hostSetup, "host-setup", nil, "host setup shell command (repeatable, ordered; selects the host key)")
	f.StringArrayVar(&s.runSetup, "run-setup", nil, "shell command run before ARGV in its workdir (repeatable, ordered)")
	f.StringArrayVarP(&s.env, "env", "e", nil, "environment variable K=V for the command (repeatable)")
	f.StringVar(&s.workdir, "workdir", "", "directory the body starts in, relative to its run directory (a fresh one per attempt) and inside it; default: the run directory")
	f.DurationVar(&s.timeout, "timeout", 0, "kill the command after this long (0: no limit; rounded up to seconds)")
	f.IntVar(&s.maxAttempts, "max-attempts", 0, "attempts in all, 1-20: a lost worker's attempt, and with --retry-* a failing body's, runs again until they are spent (default 3)")
	f.IntSliceVar(&s.retryCodes, "retry-exit-code", nil, "run a failing body again when it exits with this status (128+n: killed by signal n); repeatable or comma-separated")
	f.BoolVar(&s.retryTimeout, "retry-timeout", false, "run a body that ran past --timeout again")
	f.DurationVar(&s.retryBackoff, "retry-backoff", 0, "wait before the first retry, 1s-15m (rounded up to seconds), doubling each time, at most 15m (default 10s)")
	f.StringVar(&s.drainSignal, "drain-signal", "", "signal the body's process group gets as its worker starts to drain, inside the grace window: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2 (default: none)")
	f.IntSliceVar(&s.requeueCodes, "requeue-exit-code", nil, "a body that exits with this status while its worker drains is handed back to the queue (attempt + 1) instead of recorded; repeatable or comma-separated")
	f.StringVar(&s.input, "input", "", "the body's input, a JSON value (@FILE reads it from a file): nymph writes it to NYMPH_INPUT_FILE, and a Python body gets it as its argument; at most 256 KiB")
	f.BoolVar(&s.resident, "resident", false, "run ARGV as a resident body: nymph keeps it warm and hands it invocation after invocation through NYMPH_RUNTIME_API (Python: dls.serve(); docs/warm.md)")
}

// jobRequest is the submit the job flags ask for, without argv or key.
// A 0 the request cannot carry is refused here, in the control plane's
// words; any other value goes as it is, for the control plane to judge.
func (s *submitOptions) jobRequest(f *pflag.FlagSet) (wire.SubmitRequest, error) {
	if s.timeout < 0 {
		return wire.SubmitRequest{}, errors.New("--timeout must not be negative")
	}
	env, err := parseEnv(s.env)
	if err != nil {
		return wire.SubmitRequest{}, err
	}
	backoffS := int((s.retryBackoff + time.Second - 1) / time.Second)
	if f.Changed("max-attempts") && s.maxAttempts == 0 {
		return wire.SubmitRequest{}, fmt.Errorf("--max-attempts 0: %w", wire.CheckMaxAttempts(0))
	}
	if f.Changed("retry-backoff") && backoffS == 0 {
		return wire.SubmitRequest{}, fmt.Errorf("--retry-backoff %s: %w", s.retryBackoff, wire.CheckRetryBackoffS(0))
	}
	req := wire.SubmitRequest{
		Queue: s.queue,
		Env:   env,
		RunConfig: wire.RunConfig{
			HostSetup:        s.hostSetup,
			RunSetup:         s.runSetup,
			Workdir:          s.workdir,
			DrainSignal:      s.drainSignal,
			RequeueExitCodes: s.requeueCodes,
			Resident:         s.resident,
		},
		TimeoutS:    int((s.timeout + time.Second - 1) / time.Second),
		MaxAttempts: s.maxAttempts,
	}
	if req.Input, err = readInputFlag(s.input); err != nil {
		return wire.SubmitRequest{}, err
	}
	if len(s.retryCodes) > 0 || s.retryTimeout || f.Changed("retry-backoff") {
		req.Retry = &wire.RetryPolicy{ExitCodes: s.retryCodes, Timeout: s.retryTimeout, BackoffS: backoffS}
	}
	return req, nil
}

func runSubmit(cmd *cobra.Command, o *clientOptions, s submitOptions, argv []string) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	if s.waitTimeout < 0 {
		return errors.New("--wait-timeout must not be negative")
	}
	if s.logs && (!s.wait || o.json()) {
		return errors.New("--logs needs --wait, and writes the output where --output json would go: use one or the other")
	}
	req, err := s.jobRequest(cmd.Flags())
	if err != nil {
		return err
	}
	req.Argv, req.IdempotencyKey = argv, s.idempotencyKey
	ctx := cmd.Context()
	inv, created, err := c.Submit(ctx, req)
	if err != nil {
		return err
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if !created {
		fmt.Fprintf(stderr, "idempotency key %q was used before: this is %s, already %s\n",
			s.idempotencyKey, inv.InvocationID, inv.State)
	}
	if !s.wait {
		if o.json() {
			return printJSON(stdout, inv)
		}
		_, err := fmt.Fprintln(stdout, inv.InvocationID)
		return err
	}
	if !o.json() {
		fmt.Fprintln(stdout, inv.InvocationID)
	}
	ctx, cancel := withWaitTimeout(ctx, s.waitTimeout)
	defer cancel()
	if s.logs {
		if err := followLogs(ctx, c, inv.InvocationID, logsOptions{follow: true}, stdout, stderr); err != nil {
			return fmt.Errorf("stopped following %s: %w", inv.InvocationID, err)
		}
	}
	final, err := waitInvocation(ctx, c, inv, stderr, 0)
	if err != nil {
		return err
	}
	if o.json() {
		if err := printJSON(stdout, final); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stdout, summary(final))
	}
	if final.State != wire.StateSucceeded {
		return errors.New(outcome(final))
	}
	return nil
}

// parseEnv turns K=V flags into a map.
func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env wants K=V, got %q", kv)
		}
		env[k] = v
	}
	return env, nil
}

// Bounds of the --wait backoff. The first checks come quickly because short
// invocations are common; a long one is checked every few seconds.
var (
	waitMinInterval = 200 * time.Millisecond
	waitMaxInterval = 5 * time.Second
)

// waitInvocation follows inv until it is terminal, printing a progress line
// to progress whenever its state, attempt or worker changes. Transport
// failures and 5xx answers are retried (the control plane may be
// restarting); any other error answer ends the wait. timeout 0 waits until
// ctx ends.
func waitInvocation(ctx context.Context, c *client.Client, inv wire.Invocation, progress io.Writer, timeout time.Duration) (wire.Invocation, error) {
	ctx, cancel := withWaitTimeout(ctx, timeout)
	defer cancel()
	last := ""
	delay := waitMinInterval
	for {
		if key := inv.State + "/" + fmt.Sprint(inv.Attempt) + "/" + inv.WorkerID + "/" + fmt.Sprint(inv.CancelRequested); key != last {
			last = key
			delay = waitMinInterval
			fmt.Fprintf(progress, "%s %s\n", time.Now().Format(time.TimeOnly), progressLine(inv))
		}
		if wire.Terminal(inv.State) {
			return inv, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return inv, fmt.Errorf("stopped waiting for %s, still %s: %w", inv.InvocationID, inv.State, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(delay*3/2, waitMaxInterval)
		next, err := c.GetInvocation(ctx, inv.InvocationID)
		switch {
		case err == nil:
			inv = next
		case ctx.Err() != nil:
			return inv, fmt.Errorf("stopped waiting for %s, still %s: %w", inv.InvocationID, inv.State, context.Cause(ctx))
		case client.Retryable(err):
			fmt.Fprintf(progress, "%s %v (still waiting)\n", time.Now().Format(time.TimeOnly), err)
		default:
			return inv, err
		}
	}
}

// progressLine describes where an invocation is, for --wait.
func progressLine(inv wire.Invocation) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", inv.InvocationID, inv.State)
	if inv.Attempt > 0 {
		fmt.Fprintf(&b, " attempt %d/%d", inv.Attempt, inv.MaxAttempts)
	}
	if inv.WorkerID != "" {
		fmt.Fprintf(&b, " on %s", inv.WorkerID)
	}
	if inv.CancelRequested && !wire.Terminal(inv.State) {
		b.WriteString(" (cancel requested)")
	}
	return b.String()
}

// summary is the one line --wait prints for a finished invocation.
func summary(inv wire.Invocation) string {
	s := fmt.Sprintf("%s %s exit_code=%s attempt=%d/%d", inv.InvocationID, inv.State, exitCode(inv.ExitCode), inv.Attempt, inv.MaxAttempts)
	if inv.WorkerID != "" {
		s += " worker=" + inv.WorkerID
	}
	return s
}

// outcome is the error a --wait returns for an invocation that did not
// succeed: its state, exit code and error.
func outcome(inv wire.Invocation) string {
	s := fmt.Sprintf("invocation %s %s", inv.InvocationID, inv.State)
	if inv.ExitCode != nil {
		s += fmt.Sprintf(" with exit code %d", *inv.ExitCode)
	}
	if inv.Error != nil {
		s += ": " + errorText(inv.Error)
	}
	return s
}

func newGetCmd(o *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one invocation (inv_…) or worker (wrk_…)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			id, out := args[0], cmd.OutOrStdout()
			switch {
			case strings.HasPrefix(id, "inv_"):
				inv, err := c.GetInvocation(cmd.Context(), id)
				if err != nil {
					return err
				}
				if o.json() {
					return printJSON(out, inv)
				}
				return describeInvocation(out, inv, time.Now())
			case strings.HasPrefix(id, "wrk_"):
				w, err := c.GetWorker(cmd.Context(), id)
				if err != nil {
					return err
				}
				if o.json() {
					return printJSON(out, w)
				}
				ws := []wire.Worker{w}
				if err := showHeld(cmd.Context(), c, ws); err != nil {
					return err
				}
				return describeWorker(out, ws[0], time.Now())
			default:
				return fmt.Errorf("%q is neither an invocation id (inv_…) nor a worker id (wrk_…)", id)
			}
		},
	}
}

func newCancelCmd(o *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel INVOCATION_ID",
		Short: "Cancel an invocation: a queued one at once, a running one on its worker's next poll",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			inv, err := c.CancelInvocation(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if o.json() {
				return printJSON(out, inv)
			}
			if inv.State == wire.StateRunning {
				_, err = fmt.Fprintf(out, "%s cancel requested; %s stops it on its next poll\n", inv.InvocationID, inv.WorkerID)
				return err
			}
			_, err = fmt.Fprintf(out, "%s %s\n", inv.InvocationID, inv.State)
			return err
		},
	}
}

func newDrainCmd(o *clientOptions) *cobra.Command {
	return oneArgCmd(o, &cobra.Command{Use: "drain WORKER_ID", Short: "Drain a worker: it claims nothing more, finishes what it runs and leaves"},
		func(ctx context.Context, c *client.Client, id string) (wire.DrainAccepted, error) {
			return c.DrainWorker(ctx, id)
		},
		func(w io.Writer, d wire.DrainAccepted) error {
			_, err := fmt.Fprintf(w, "%s %s: %s\n", d.WorkerID, d.State, d.Note)
			return err
		})
}

// oneArgCmd makes cmd take one argument, ask the control plane with do,
// and print the answer: as JSON with --output json, else with text.
func oneArgCmd[T any](o *clientOptions, cmd *cobra.Command, do func(context.Context, *client.Client, string) (T, error), text func(io.Writer, T) error) *cobra.Command {
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := o.client()
		if err != nil {
			return err
		}
		v, err := do(cmd.Context(), c, args[0])
		if err != nil {
			return err
		}
		if o.json() {
			return printJSON(cmd.OutOrStdout(), v)
		}
		return text(cmd.OutOrStdout(), v)
	}
	return cmd
}

func newReleaseHoldCmd(o *clientOptions) *cobra.Command {
	var req wire.ReleaseHoldRequest
	cmd := &cobra.Command{
		Use:   "release-hold [INVOCATION_ID]",
		Short: "Let the provisioner launch again for work whose hosts failed",
		Long: `After hosts launched for a queue and host key fail (their host setup failed,
they never said hello, EC2 refused them), the provisioner holds that key's
launches back, and after 3 failures in a row stops them for 6 hours; its
queued work shows why it waits ("Waiting" in lakeshore get). Once the cause is
fixed (the launch template, the image, what the setup needs), release-hold
lets the next pass launch for it at once, as for a key that never failed.

Name the key by an invocation waiting on it, or by --queue and --host-key
(none for the queue's work with no host setup).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				if req.Queue != "" || req.HostKey != "" {
					return errors.New("release-hold: name the key by an invocation or by --queue and --host-key, not both")
				}
				inv, err := c.GetInvocation(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				req = wire.ReleaseHoldRequest{Queue: inv.Queue, HostKey: inv.HostKey}
			} else if req.Queue == "" {
				return errors.New("release-hold: name the key by an invocation, or by --queue (and --host-key)")
			}
			r, err := c.ReleaseHold(cmd.Context(), req)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), r)
			}
			key := r.Queue
			if r.HostKey != "" {
				key += " " + r.HostKey
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", key, r.Note)
			return err
		},
	}
	cmd.Flags().StringVar(&req.Queue, "queue", "", "the queue whose launches are held back")
	cmd.Flags().StringVar(&req.HostKey, "host-key", "", "the host key (hk1_…) whose launches are held back; none for work with no host setup")
	return cmd
}

func newSetupCmd(o *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "setup WORKER_ID [-- ARGV...]",
		Short: "Queue a setup command on a worker, or list its setup commands",
		Long: `With ARGV, append a setup command to the worker's setup FIFO and print its
command id; the worker runs it before it claims more work. Without ARGV, list
the worker's setup commands and their outcomes.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			id, argv, out := args[0], args[1:], cmd.OutOrStdout()
			if len(argv) > 0 {
				acc, err := c.AddSetup(cmd.Context(), id, argv)
				if err != nil {
					return err
				}
				if o.json() {
					return printJSON(out, acc)
				}
				_, err = fmt.Fprintln(out, acc.CommandID)
				return err
			}
			res, err := c.SetupResults(cmd.Context(), id)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(out, res)
			}
			return setupTable(out, res, time.Now())
		},
	}
}

// withWaitTimeout bounds a wait by --wait-timeout d (0: no bound), the
// error naming the flag.
func withWaitTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("--wait-timeout %s passed", d))
}

// readInputFlag reads --input: a JSON value, or @FILE holding one ("":
// none). The control plane checks the size.
func readInputFlag(v string) (json.RawMessage, error) {
	if v == "" {
		return nil, nil
	}
	b := []byte(v)
	if name, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		if b, err = os.ReadFile(name); err != nil {
			return nil, fmt.Errorf("--input: %w", err)
		}
	}
	if !json.Valid(b) {
		return nil, errors.New("--input: not a JSON value (a string needs its quotes: --input '\"text\"')")
	}
	return json.RawMessage(b), nil
}
