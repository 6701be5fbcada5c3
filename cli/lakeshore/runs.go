package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// How run submit retries a POST whose answer it did not get (a transport
// error or a 5xx): with the same idempotency key, so the control plane
// answers the run the first POST made, or finishes writing it.
var (
	runSubmitAttempts   = 5
	runSubmitMinBackoff = 500 * time.Millisecond
	runSubmitMaxBackoff = 8 * time.Second
)

// runPollInterval is how often run wait reads the run's counts.
var runPollInterval = time.Second

// maxCancelRounds bounds run cancel's calls: each works up to 20 s, so
// this is over half an hour of cancelling, far more than a run's 10,000
// jobs need.
const maxCancelRounds = 100

func newRunCmd(o *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Submit and follow runs: many jobs on one queue, from a matrix or a job list",
		Long: `A run is many jobs on one queue, submitted in one request: the product of a
matrix's axes, or a list of jobs. Each job is an invocation; the run counts
them as they finish.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("say what to do: lakeshore run submit|get|ls|wait|results|cancel")
		},
	}
	cmd.AddCommand(newRunSubmitCmd(o), newRunGetCmd(o), newRunLsCmd(o), newRunWaitCmd(o),
		newRunResultsCmd(o), newRunCancelCmd(o), newRunRetryCmd(o))
	return cmd
}

type runSubmitOptions struct {
	job            submitOptions
	matrix         []string
	jobsFile       string
	name           string
	idempotencyKey string
	wait           bool
	waitTimeout    time.Duration
}

func newRunSubmitCmd(o *clientOptions) *cobra.Command {
	var s runSubmitOptions
	cmd := &cobra.Command{
		Use:   "submit [flags] -- ARGV...",
		Short: "Queue a run: a matrix's product or a file of jobs, and print its id",
		Long: `Queue a run on a queue and print its id (its job count on stderr).

With --matrix, the jobs are the product of the axes (repeat --matrix, one
axis each: --matrix model=a,b --matrix epoch=1,2 is 4 jobs); "{axis}" in
ARGV is the job's value on that axis, and the job's environment has
LAKESHORE_MATRIX_<AXIS>:

  lakeshore run submit --queue gpu --matrix model=a,b -- python train.py --model {model}

With --jobs FILE, one JSON object a line is one job (argv, env,
run_config, timeout_s, max_attempts; "-" reads stdin); what a job leaves
out comes from ARGV and the flags. A run takes --matrix or --jobs.

The flags after --queue are every job's, as in lakeshore submit. The
submit carries an idempotency key (random unless --idempotency-key), and a
POST whose answer is lost (a transport error, a 5xx) is sent again with
the same key, so it never makes two runs.

With --wait, follow the run as lakeshore run wait does.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runRunSubmit(cmd, o, &s, args)
		},
	}
	cmd.Flags().SetInterspersed(false)
	f := cmd.Flags()
	s.job.registerJobFlags(f)
	f.StringArrayVar(&s.matrix, "matrix", nil, "a matrix axis, NAME=V1,V2,... (repeatable, one axis each)")
	f.StringVar(&s.jobsFile, "jobs", "", "a JSON-lines file of jobs, one wire job object a line (- for stdin)")
	f.StringVar(&s.name, "name", "", "the run's name, shown by run ls and run get")
	f.StringVar(&s.idempotencyKey, "idempotency-key", "", "submitting the same key again returns the first run (default: a random key, kept across this command's own retries)")
	f.BoolVarP(&s.wait, "wait", "w", false, "follow the run until every job is done; exit 1 unless every job succeeded")
	f.DurationVar(&s.waitTimeout, "wait-timeout", 0, "give up waiting after this long (0: wait until interrupted)")
	return cmd
}

func runRunSubmit(cmd *cobra.Command, o *clientOptions, s *runSubmitOptions, argv []string) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	if s.waitTimeout < 0 {
		return errors.New("--wait-timeout must not be negative")
	}
	if s.waitTimeout > 0 && !s.wait {
		return errors.New("--wait-timeout needs --wait")
	}
	job, err := s.job.jobRequest(cmd.Flags())
	if err != nil {
		return err
	}
	req := wire.RunRequest{Queue: job.Queue, Name: s.name, Argv: argv, Env: job.Env, RunConfig: job.RunConfig,
		TimeoutS: job.TimeoutS, MaxAttempts: job.MaxAttempts, Retry: job.Retry, Input: job.Input}
	switch {
	case len(s.matrix) > 0 && s.jobsFile != "":
		return errors.New("--matrix and --jobs exclude each other: a run is a matrix's product or a list of jobs")
	case len(s.matrix) > 0:
		if len(argv) == 0 {
			return errors.New("a matrix run needs ARGV after --: the command every job runs")
		}
		if req.Matrix, err = parseMatrix(s.matrix); err != nil {
			return err
		}
	case s.jobsFile != "":
		if req.Jobs, err = readJobs(s.jobsFile, cmd.InOrStdin()); err != nil {
			return err
		}
	default:
		return errors.New("a run needs --matrix NAME=V1,V2 or --jobs FILE")
	}
	req.IdempotencyKey = s.idempotencyKey
	if req.IdempotencyKey == "" {
		if req.IdempotencyKey, err = newIdempotencyKey(); err != nil {
			return err
		}
	}
	ctx, stdout, stderr := cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	created, fresh, err := submitRunRetrying(ctx, c, req, stderr)
	if err != nil {
		return err
	}
	if !fresh && s.idempotencyKey != "" {
		fmt.Fprintf(stderr, "idempotency key %q was used before: this is %s\n", s.idempotencyKey, created.RunID)
	}
	if !s.wait {
		if o.json() {
			return printJSON(stdout, created)
		}
		fmt.Fprintf(stderr, "run %s: %d jobs on queue %s\n", created.RunID, created.Total, cell(req.Queue))
		_, err := fmt.Fprintln(stdout, created.RunID)
		return err
	}
	if !o.json() {
		fmt.Fprintf(stderr, "run %s: %d jobs on queue %s\n", created.RunID, created.Total, cell(req.Queue))
		fmt.Fprintln(stdout, created.RunID)
	}
	ctx, cancel := withWaitTimeout(ctx, s.waitTimeout)
	defer cancel()
	return finishRunWait(ctx, c, o, created.RunID, stdout, stderr)
}

// submitRunRetrying posts req, and posts it again with the same
// idempotency key after a transport error or a 5xx, a bounded number of
// times with doubling backoff. fresh reports whether the answer was a new
// run (201): after a lost answer it is the replay (200) of the one the
// lost POST made.
func submitRunRetrying(ctx context.Context, c *client.Client, req wire.RunRequest, progress io.Writer) (created wire.RunCreated, fresh bool, err error) {
	delay := runSubmitMinBackoff
	for attempt := 1; ; attempt++ {
		created, fresh, err = c.SubmitRun(ctx, req)
		if err == nil || !client.Retryable(err) || ctx.Err() != nil {
			return created, fresh, err
		}
		if attempt >= runSubmitAttempts {
			return created, fresh, fmt.Errorf("gave up after %d attempts (idempotency key %s; submitting again with --idempotency-key %s makes no second run): %w",
				attempt, req.IdempotencyKey, req.IdempotencyKey, err)
		}
		fmt.Fprintf(progress, "%v; sending it again with the same idempotency key in %s\n", err, delay)
		if err := clock.Sleep(ctx, delay); err != nil {
			return created, fresh, fmt.Errorf("submit run: stopped retrying: %w", context.Cause(ctx))
		}
		delay = min(delay*2, runSubmitMaxBackoff)
	}
}

// newIdempotencyKey is a random key for one run submit.
func newIdempotencyKey() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("idempotency key: %w", err)
	}
	return "cli-" + hex.EncodeToString(b), nil
}

// parseMatrix turns --matrix NAME=V1,V2 flags into the request's axes.
// The names and values themselves are for the control plane to judge.
func parseMatrix(flags []string) (map[string][]string, error) {
	m := make(map[string][]string, len(flags))
	for _, f := range flags {
		name, list, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--matrix wants NAME=V1,V2,..., got %q", f)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("--matrix %s is given twice: list all its values in one flag", name)
		}
		values := strings.Split(list, ",")
		for _, v := range values {
			if v == "" {
				return nil, fmt.Errorf("--matrix %q has an empty value", f)
			}
		}
		m[name] = values
	}
	return m, nil
}

// readJobs reads a JSON-lines file of jobs (path "-": stdin). Blank lines
// are skipped; a line that is not one job object is named by its number.
func readJobs(path string, stdin io.Reader) ([]wire.RunJob, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--jobs: %w", err)
		}
		defer f.Close()
		r = f
	}
	// The whole request must fit in one POST body, so a bigger file
	// cannot be a run.
	data, err := io.ReadAll(io.LimitReader(r, wire.MaxRunBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--jobs %s: %w", path, err)
	}
	if len(data) > wire.MaxRunBodyBytes {
		return nil, fmt.Errorf("--jobs %s: over %d bytes, more than one run's request holds", path, wire.MaxRunBodyBytes)
	}
	var jobs []wire.RunJob
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), wire.MaxRunBodyBytes+1)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		var j wire.RunJob
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("--jobs %s line %d: %w", path, n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("--jobs %s line %d: one job object a line", path, n)
		}
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--jobs %s: %w", path, err)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("--jobs %s holds no jobs", path)
	}
	return jobs, nil
}

func newRunGetCmd(o *clientOptions) *cobra.Command {
	return oneArgCmd(o, &cobra.Command{Use: "get RUN", Short: "Show a run: its state and its jobs' counts"},
		func(ctx context.Context, c *client.Client, id string) (wire.Run, error) { return c.Run(ctx, id) },
		describeRun)
}

// describeRun writes a run's fields, one a line.
func describeRun(w io.Writer, r wire.Run) error {
	tw := newTable(w)
	cn := r.Counts
	fmt.Fprintf(tw, "Run:\t%s\n", cell(r.RunID))
	fmt.Fprintf(tw, "Queue:\t%s\n", cell(r.Queue))
	fmt.Fprintf(tw, "Name:\t%s\n", dash(r.Name))
	fmt.Fprintf(tw, "State:\t%s\n", cell(r.State))
	fmt.Fprintf(tw, "Done:\t%d/%d\n", r.DoneCount, r.Total)
	fmt.Fprintf(tw, "Jobs:\tqueued=%d running=%d succeeded=%d failed=%d cancelled=%d\n",
		cn[wire.StateQueued], cn[wire.StateRunning], cn[wire.StateSucceeded], cn[wire.StateFailed], cn[wire.StateCancelled])
	fmt.Fprintf(tw, "Created:\t%s\n", cell(r.CreatedAt))
	return tw.Flush()
}

func newRunLsCmd(o *clientOptions) *cobra.Command {
	var queue string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List runs, newest first, optionally of one queue",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			list, err := c.Runs(cmd.Context(), queue)
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), list)
			}
			return runTable(cmd.OutOrStdout(), list.Runs, time.Now())
		},
	}
	cmd.Flags().StringVarP(&queue, "queue", "q", "", "only this queue's runs")
	return cmd
}

// runTable writes runs as a table, in the order given.
func runTable(w io.Writer, runs []wire.Run, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tQUEUE\tNAME\tSTATE\tDONE\tSUCCEEDED\tFAILED\tCREATED")
	for _, r := range runs {
		created, _ := time.Parse(time.RFC3339Nano, r.CreatedAt)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", cell(r.RunID), cell(r.Queue), dash(r.Name), cell(r.State),
			r.DoneCount, r.Total, r.Counts[wire.StateSucceeded], r.Counts[wire.StateFailed], age(now, created))
	}
	return tw.Flush()
}

func newRunCancelCmd(o *clientOptions) *cobra.Command {
	return oneArgCmd(o, &cobra.Command{
		Use:   "cancel RUN",
		Short: "Cancel a run's jobs that are not done",
		Long: `Cancel every job of the run that is not done: a queued one at once, a
running one through its worker's next poll. A run of many jobs may take
more than one request; the command asks again until none remains.`,
	}, cancelRun, func(w io.Writer, total wire.RunCancelled) error {
		_, err := fmt.Fprintf(w, "%s: cancel asked of %d jobs\n", total.RunID, total.Cancelled)
		return err
	})
}

// cancelRun asks for the run's jobs to be cancelled until none remains
// and adds up what each request cancelled.
func cancelRun(ctx context.Context, c *client.Client, id string) (wire.RunCancelled, error) {
	total := wire.RunCancelled{RunID: id}
	var err error
	total.Cancelled, total.Remaining, err = askUntilNoneRemain("cancel", id, func() (int, int, error) {
		r, err := c.CancelRun(ctx, id)
		return r.Cancelled, r.Remaining, err
	})
	return total, err
}

// askUntilNoneRemain makes request ask of run id again while it answers
// that jobs remain (at most maxCancelRounds times), adding up how many
// jobs each acted on.
func askUntilNoneRemain(what, id string, ask func() (n, remaining int, err error)) (total, remaining int, err error) {
	for range maxCancelRounds {
		n, left, err := ask()
		if err != nil {
			return total, left, err
		}
		total, remaining = total+n, left
		if remaining == 0 {
			return total, 0, nil
		}
	}
	return total, remaining, fmt.Errorf("%s run %s: %d jobs still to look at after %d requests; run it again", what, id, remaining, maxCancelRounds)
}

func newRunRetryCmd(o *clientOptions) *cobra.Command {
	var failed bool
	cmd := oneArgCmd(o, &cobra.Command{
		Use:   "retry --failed RUN",
		Short: "Queue a run's failed jobs again",
		Long: `Queue every failed job of the run again: its failure no longer counts in
the run, and it gets its max_attempts again. A job already queued again is
not failed, so running the command twice queues nothing twice. A run of
many jobs may take more than one request; the command asks again until
none remains.`,
	}, func(ctx context.Context, c *client.Client, id string) (wire.RunRetried, error) {
		if !failed {
			return wire.RunRetried{}, errors.New("run retry needs --failed: only a run's failed jobs are queued again")
		}
		return retryRun(ctx, c, id)
	}, func(w io.Writer, total wire.RunRetried) error {
		_, err := fmt.Fprintf(w, "%s: %d failed jobs queued again\n", total.RunID, total.Retried)
		return err
	})
	cmd.Flags().BoolVar(&failed, "failed", false, "queue the run's failed jobs again (required)")
	return cmd
}

// retryRun asks for the run's failed jobs to be queued again until no job
// remains to look at, and adds up what each request queued.
func retryRun(ctx context.Context, c *client.Client, id string) (wire.RunRetried, error) {
	total := wire.RunRetried{RunID: id}
	var err error
	total.Retried, total.Remaining, err = askUntilNoneRemain("retry", id, func() (int, int, error) {
		r, err := c.RetryRun(ctx, id)
		return r.Retried, r.Remaining, err
	})
	return total, err
}

func newRunResultsCmd(o *clientOptions) *cobra.Command {
	var records bool
	cmd := &cobra.Command{
		Use:   "results [--records] RUN",
		Short: "Print a run's results as JSON lines, one a job in index order",
		Long: `Print one JSON line a job, in index order: its index, invocation id,
state, counted attempt, and once done its exit code and result. With
--records, one line per element of each done job's JSON-array result (a
body that wrote JSON lines to $NYMPH_RESULT_FILE): {"index":N,"record":…}.
The output is JSON lines whatever --output says.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			w := bufio.NewWriter(cmd.OutOrStdout())
			err = c.RunResults(cmd.Context(), args[0], client.RunResultsParams{Records: records}, func(line json.RawMessage) error {
				if _, err := w.Write(line); err != nil {
					return err
				}
				return w.WriteByte('\n')
			})
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&records, "records", false, "one line per element of each job's JSON-array result")
	return cmd
}

func newRunWaitCmd(o *clientOptions) *cobra.Command {
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait RUN",
		Short: "Follow a run until every job is done; exit 1 unless every job succeeded",
		Long: `Follow a run until every job is done, with its progress on stderr: on a
terminal one line redrawn in place (done/total, succeeded, failed, jobs a
second, time left); otherwise a line at each tenth of the run and at the
end. Then print the run (as run get --output json with --output json).

Exit 0 when every job succeeded; 1 when any failed or was cancelled, or
the wait stopped first (--wait-timeout, an interrupt, an error answer).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if waitTimeout < 0 {
				return errors.New("--wait-timeout must not be negative")
			}
			ctx := cmd.Context()
			ctx, cancel := withWaitTimeout(ctx, waitTimeout)
			defer cancel()
			return finishRunWait(ctx, c, o, args[0], cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 0, "give up waiting after this long (0: wait until interrupted)")
	return cmd
}

// finishRunWait follows run id to its end with progress on stderr, prints
// it, and returns an error unless every job succeeded.
func finishRunWait(ctx context.Context, c *client.Client, o *clientOptions, id string, stdout, stderr io.Writer) error {
	p := newRunProgress(stderr, isTerminal(stderr), clock.Clock{})
	r, err := waitRun(ctx, c, id, p, runPollInterval)
	if err != nil {
		return err
	}
	if o.json() {
		if err := printJSON(stdout, r); err != nil {
			return err
		}
	} else if _, err := fmt.Fprintln(stdout, runSummary(r)); err != nil {
		return err
	}
	return runOutcome(r)
}

// runSucceeded reports whether every job of a done run succeeded.
func runSucceeded(r wire.Run) bool {
	return r.State == wire.RunDone && r.Counts[wire.StateSucceeded] == r.Total
}

// runOutcome is nil for a run whose every job succeeded, else the error
// that says how many did not.
func runOutcome(r wire.Run) error {
	if runSucceeded(r) {
		return nil
	}
	return fmt.Errorf("run %s: %d of %d jobs did not succeed (failed %d, cancelled %d)", r.RunID,
		r.Total-r.Counts[wire.StateSucceeded], r.Total, r.Counts[wire.StateFailed], r.Counts[wire.StateCancelled])
}

// runSummary is the one line a finished wait prints.
func runSummary(r wire.Run) string {
	return fmt.Sprintf("%s %s %d/%d succeeded=%d failed=%d cancelled=%d", r.RunID, r.State, r.DoneCount, r.Total,
		r.Counts[wire.StateSucceeded], r.Counts[wire.StateFailed], r.Counts[wire.StateCancelled])
}

// waitRun reads run id every interval until it is done, showing each read
// on p. Transport failures and 5xx answers are retried (the control plane
// may be restarting); any other error answer ends the wait.
func waitRun(ctx context.Context, c *client.Client, id string, p *runProgress, interval time.Duration) (wire.Run, error) {
	var last wire.Run
	seen := false
	for {
		r, err := c.Run(ctx, id)
		switch {
		case err == nil:
			last, seen = r, true
			p.show(r)
			if r.State == wire.RunDone {
				p.end()
				return r, nil
			}
		case ctx.Err() != nil:
		case client.Retryable(err):
			p.note(fmt.Sprintf("%v (still waiting)", err))
		default:
			p.end()
			return last, err
		}
		if err := clock.Sleep(ctx, interval); err != nil {
			p.end()
			if !seen {
				return last, fmt.Errorf("stopped waiting for %s: %w", id, context.Cause(ctx))
			}
			return last, fmt.Errorf("stopped waiting for %s, %d/%d done: %w", id, last.DoneCount, last.Total, context.Cause(ctx))
		}
	}
}

// runProgress shows a run's progress: on a terminal one line redrawn in
// place; elsewhere (a log, a pipe) a line at the first read, each time
// the run passes another tenth of its jobs, and at the end.
type runProgress struct {
	w     io.Writer
	tty   bool
	clock clock.Clock
	// start and startDone are the first read's time and done count: the
	// rate is of the jobs seen finishing since.
	start     time.Time
	startDone int
	started   bool
	tenth     int  // the last tenth a plain line was printed for
	drawn     bool // a terminal line is on screen, not yet ended
}

func newRunProgress(w io.Writer, tty bool, c clock.Clock) *runProgress {
	return &runProgress{w: w, tty: tty, clock: c, tenth: -1}
}

// show takes one read of the run.
func (p *runProgress) show(r wire.Run) {
	now := p.clock.Now()
	if !p.started {
		p.start, p.startDone, p.started = now, r.DoneCount, true
	}
	line := p.line(r, now)
	if p.tty {
		// \r and erase-line: the bar is redrawn over itself.
		fmt.Fprintf(p.w, "\r\x1b[K%s", line)
		p.drawn = true
		return
	}
	tenth := 10
	if r.Total > 0 {
		tenth = r.DoneCount * 10 / r.Total
	}
	if tenth > p.tenth {
		p.tenth = tenth
		fmt.Fprintln(p.w, line)
	}
}

// note prints a message (a retried error) on its own line.
func (p *runProgress) note(msg string) {
	p.end()
	fmt.Fprintf(p.w, "%s %s\n", p.clock.Now().Format(time.TimeOnly), msg)
}

// end ends a terminal line, so what follows starts on a line of its own.
func (p *runProgress) end() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// barWidth is the terminal bar's width in cells.
const barWidth = 20

// line renders one progress line: done/total, its bar on a terminal, the
// counts, the rate and the time left.
func (p *runProgress) line(r wire.Run, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d/%d", cell(r.RunID), r.DoneCount, r.Total)
	if p.tty {
		filled := barWidth
		if r.Total > 0 {
			filled = r.DoneCount * barWidth / r.Total
		}
		b.WriteString(" [" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "]")
	}
	pct := 100
	if r.Total > 0 {
		pct = r.DoneCount * 100 / r.Total
	}
	fmt.Fprintf(&b, " %d%% succeeded=%d failed=%d", pct, r.Counts[wire.StateSucceeded], r.Counts[wire.StateFailed])
	if c := r.Counts[wire.StateCancelled]; c > 0 {
		fmt.Fprintf(&b, " cancelled=%d", c)
	}
	elapsed := now.Sub(p.start)
	finished := r.DoneCount - p.startDone
	if elapsed <= 0 || finished <= 0 {
		b.WriteString(" rate=- eta=-")
		return b.String()
	}
	rate := float64(finished) / elapsed.Seconds()
	fmt.Fprintf(&b, " rate=%.2f/s", rate)
	left := r.Total - r.DoneCount
	eta := time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second)
	fmt.Fprintf(&b, " eta=%s", eta)
	return b.String()
}
