package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Follow timing: how often an idle follow reads again, and how long it
// waits for the last chunks of an attempt that already ended (its worker
// ships them just after its outcome) before it says none came.
var (
	logPollInterval = time.Second
	logEndGrace     = 15 * time.Second
)

type logsOptions struct {
	attempt int
	follow  bool
}

func newLogsCmd(o *clientOptions) *cobra.Command {
	var l logsOptions
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print an invocation's output (stdout and stderr), or follow it",
		Long: `Print the output an invocation's body wrote, as its worker shipped it: its
stdout to stdout and its stderr to stderr, in the order the worker read them
(within about a second of each other the two streams may interleave
differently than they were written).

Without --attempt it reads the latest attempt. With --follow it keeps reading
until the attempt's output is complete; following the latest attempt, it moves
on to the next one when the invocation is handed to another worker, and stops
once the invocation is finished.

Output past the per-attempt cap is kept as its head and its tail, with a line
on stderr saying how many bytes were left out. Output is kept 7 days.
Printed to a terminal, control characters are shown escaped (\x1b); piped or
redirected, the bytes are written as they are.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if l.attempt < 0 {
				return errors.New("--attempt must be 1 or more")
			}
			return followLogs(cmd.Context(), c, args[0], l, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().IntVar(&l.attempt, "attempt", 0, "read this attempt (default: the latest)")
	cmd.Flags().BoolVarP(&l.follow, "follow", "f", false, "keep reading until the output is complete")
	return cmd
}

// logWriter writes chunks to the two streams, escaped for a terminal.
type logWriter struct {
	stdout, stderr io.Writer
	escOut, escErr bool
}

func newLogWriter(stdout, stderr io.Writer) *logWriter {
	return &logWriter{stdout: stdout, stderr: stderr, escOut: isTerminal(stdout), escErr: isTerminal(stderr)}
}

func (w *logWriter) chunk(c wire.LogChunk) error {
	out, esc := w.stdout, w.escOut
	if c.Stream == "stderr" {
		out, esc = w.stderr, w.escErr
	}
	if c.Dropped > 0 {
		w.note("%d bytes of %s left out here (over the per-attempt cap; its head and tail are kept)", c.Dropped, c.Stream)
	}
	data := string(c.Data)
	if esc {
		data = block(data)
	}
	_, err := io.WriteString(out, data)
	return err
}

// note writes one line of lakeshore's own to stderr, marked as such.
func (w *logWriter) note(format string, args ...any) {
	fmt.Fprintf(w.stderr, "[lakeshore] "+format+"\n", args...)
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// followLogs prints invocation id's output (logsOptions) and, with follow,
// reads on until it is complete. Transport failures and 5xx answers are
// retried while following.
func followLogs(ctx context.Context, c *client.Client, id string, l logsOptions, stdout, stderr io.Writer) error {
	w := newLogWriter(stdout, stderr)
	attempt, after := l.attempt, 0
	var endedAt time.Time // when the attempt was first seen ended without its last chunk
	for {
		page, err := c.Logs(ctx, id, attempt, after)
		if err != nil {
			if l.follow && client.Retryable(err) && ctx.Err() == nil {
				w.note("%v (still following)", err)
				if err := clock.Sleep(ctx, logPollInterval); err != nil {
					return err
				}
				continue
			}
			return err
		}
		attempt = page.Attempt
		for _, ch := range page.Chunks {
			if err := w.chunk(ch); err != nil {
				return err
			}
		}
		after = page.Next
		if len(page.Chunks) > 0 && !page.EOF {
			continue // there may be more right away
		}
		if !l.follow {
			switch {
			case attempt == 0:
				w.note("no attempt of %s has run yet", id)
			case !page.EOF:
				w.note("%s", unfinishedNote(ctx, c, id, attempt, after))
			}
			return nil
		}
		inv, err := c.GetInvocation(ctx, id)
		if err != nil {
			if client.Retryable(err) && ctx.Err() == nil {
				if err := clock.Sleep(ctx, logPollInterval); err != nil {
					return err
				}
				continue
			}
			return err
		}
		done, next := attemptOver(inv, attempt, page.EOF, &endedAt, w)
		switch {
		case next > 0 && l.attempt == 0:
			if attempt > 0 {
				w.note("attempt %d is over; the invocation runs on as attempt %d", attempt, next)
			}
			attempt, after, endedAt = next, 0, time.Time{}
			continue
		case done && (l.attempt != 0 || wire.Terminal(inv.State)):
			return nil
		}
		if err := clock.Sleep(ctx, logPollInterval); err != nil {
			return err
		}
	}
}

// attemptOver reports, for a follow of attempt n of inv, whether that
// attempt's output is over (its last chunk is in, or the attempt ended and
// none came within logEndGrace of when that was first seen, endedAt), and
// a later attempt to follow on with, if any. n 0: none had run.
func attemptOver(inv wire.Invocation, n int, eof bool, endedAt *time.Time, w *logWriter) (done bool, next int) {
	if n == 0 {
		if inv.Attempt > 0 {
			return false, inv.Attempt
		}
		return wire.Terminal(inv.State), 0 // cancelled before it ran
	}
	over := eof
	if !over && n <= len(inv.Attempts) && inv.Attempts[n-1].Outcome != "" {
		if endedAt.IsZero() {
			*endedAt = time.Now()
		}
		if time.Since(*endedAt) >= logEndGrace {
			w.note("attempt %d ended %s; its worker shipped no more of its output", n, inv.Attempts[n-1].Outcome)
			over = true
		}
	}
	if over && inv.Attempt > n {
		return true, inv.Attempt
	}
	return over, 0
}

// unfinishedNote says why attempt n's output has no end yet: the attempt
// runs on (--follow reads on), or it ended, as its history says, before its
// worker shipped the rest (shipped chunks: the seqs before after).
func unfinishedNote(ctx context.Context, c *client.Client, id string, n, after int) string {
	inv, err := c.GetInvocation(ctx, id)
	if err != nil || n > len(inv.Attempts) || inv.Attempts[n-1].Outcome == "" {
		return fmt.Sprintf("attempt %d is still running; its output so far (--follow reads on)", n)
	}
	a := inv.Attempts[n-1]
	if after == 0 {
		return fmt.Sprintf("attempt %d ended %s before its worker shipped any output", n, a.Outcome)
	}
	return fmt.Sprintf("attempt %d ended %s before its worker shipped the rest of its output", n, a.Outcome)
}
