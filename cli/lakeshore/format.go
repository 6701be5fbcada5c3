package main

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dreamlake/lakeshore/shared/display"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// printJSON writes v as indented JSON: the API's answer, re-encoded from the
// wire types the control plane itself encodes with.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// newTable returns the tabwriter every table is written through.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// dash stands in for an empty cell so columns stay aligned and parseable,
// and shows a cell's control characters escaped (cell).
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cell and block show text a worker or a submitter supplied (labels,
// argv, commands, error messages, output) with its hidden characters
// escaped (display: control characters as \x1b, \r, \x9b; format
// characters such as the bidi override U+202E as \u202e), so it cannot
// move the cursor, recolour or retitle an operator's terminal, reorder what
// the operator reads, or break a table. A block keeps newlines and tabs.
// --output json prints the strings as they are, JSON-escaped.
func cell(s string) string  { return display.Line(s) }
func block(s string) string { return display.Block(s) }

func exitCode(c *int) string {
	if c == nil {
		return "-"
	}
	return strconv.Itoa(*c)
}

func errorText(e *wire.ErrorInfo) string {
	if e == nil {
		return ""
	}
	if e.Message == "" {
		return e.Type
	}
	return e.Type + ": " + e.Message
}

// age reports how long before now t was, in the largest whole unit (42s,
// 5m, 3h, 2d); "-" for an unset time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	default:
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
}

// ago is age with " ago", for a last-seen column.
func ago(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return age(now, *t) + " ago"
}

// timestamp shows an RFC 3339 time and how long ago it was.
func timestamp(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339) + " (" + age(now, *t) + " ago)"
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellJoin renders argv as a shell would need it typed.
func shellJoin(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if shellSafe.MatchString(a) {
			parts[i] = a
		} else {
			parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return cell(strings.Join(parts, " "))
}

func sortedPairs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, " ")
}

// describeInvocation writes one invocation as aligned fields, then its
// output tails.
func describeInvocation(w io.Writer, inv wire.Invocation, now time.Time) error {
	tw := newTable(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, dash(v)) }
	row("ID", inv.InvocationID)
	row("Queue", inv.Queue)
	state := inv.State
	if inv.CancelRequested && !wire.Terminal(inv.State) {
		state += " (cancel requested)"
	}
	row("State", state)
	row("Attempt", fmt.Sprintf("%d/%d", inv.Attempt, inv.MaxAttempts))
	if p := inv.Retry; p != nil {
		row("Retry", retryText(p))
	}
	if inv.RetryAt != nil {
		row("Retry at", inv.RetryAt.UTC().Format(time.RFC3339)+" (in "+age(*inv.RetryAt, now)+"; claimable at the first sweep after)")
	}
	if inv.WaitingReason != "" {
		row("Waiting", inv.WaitingReason)
	}
	row("Worker", inv.WorkerID)
	row("Argv", shellJoin(inv.Argv))
	if len(inv.Env) > 0 {
		row("Env", sortedPairs(inv.Env))
	}
	for _, c := range inv.RunConfig.HostSetup {
		row("Host setup", c)
	}
	for _, c := range inv.RunConfig.RunSetup {
		row("Run setup", c)
	}
	if len(inv.RunConfig.Env) > 0 {
		row("Run env", sortedPairs(inv.RunConfig.Env))
	}
	if inv.RunConfig.Workdir != "" {
		row("Workdir", inv.RunConfig.Workdir)
	}
	if inv.RunConfig.DrainSignal != "" {
		row("Drain signal", inv.RunConfig.DrainSignal)
	}
	if len(inv.RunConfig.RequeueExitCodes) > 0 {
		row("Requeue on exit", joinInts(inv.RunConfig.RequeueExitCodes)+" (while its worker drains)")
	}
	if inv.RunConfig.Resident {
		row("Resident", "yes (served by a warm process)")
	}
	row("Host key", inv.HostKey)
	if inv.TimeoutS > 0 {
		row("Timeout", (time.Duration(inv.TimeoutS) * time.Second).String())
	}
	if inv.IdempotencyKey != "" {
		row("Idempotency key", inv.IdempotencyKey)
	}
	row("Exit code", exitCode(inv.ExitCode))
	row("Error", errorText(inv.Error))
	row("Created", timestamp(now, &inv.CreatedAt))
	row("Started", timestamp(now, inv.StartedAt))
	row("Finished", timestamp(now, inv.FinishedAt))
	if len(inv.ResultBlob) > 0 {
		row("Result", string(inv.ResultBlob))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(inv.Attempts) > 0 {
		fmt.Fprintln(w, "--- attempts ---")
		if err := attemptTable(w, inv.Attempts, now); err != nil {
			return err
		}
	}
	for _, tail := range []struct{ name, text string }{{"stdout", inv.StdoutTail}, {"stderr", inv.StderrTail}} {
		if tail.text == "" {
			continue
		}
		fmt.Fprintf(w, "--- %s (tail) ---\n%s", tail.name, block(tail.text))
		if !strings.HasSuffix(tail.text, "\n") {
			fmt.Fprintln(w)
		}
	}
	return nil
}

// describeWorker writes one worker as aligned fields.
func describeWorker(w io.Writer, wk wire.Worker, now time.Time) error {
	tw := newTable(w)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, dash(v)) }
	row("ID", wk.WorkerID)
	row("Label", wk.Label)
	row("Machine", wk.MachineID)
	state := wk.State
	if wk.StoredState != "" && wk.StoredState != wk.State {
		state += " (stored " + wk.StoredState + ")"
	}
	row("State", state)
	if wk.StateWhy != "" {
		row("Why", wk.StateWhy)
		row("Since", timestamp(now, wk.StateSince))
	}
	row("Phase", wk.Phase)
	row("Host status", wk.HostStatus)
	row("Host key", wk.HostKey)
	if a := wk.Adoption; a != nil {
		v := fmt.Sprintf("host key %s for queue %s, asked %s", a.HostKey, a.Queue, timestamp(now, &a.AskedAt))
		if a.Failed != "" {
			v += "; failed: " + a.Failed
		}
		row("Adoption", v)
	} else if wk.AdoptHostSetup {
		row("Adoption", "may be asked to adopt a host key (--adopt-host-setup)")
	}
	row("Lanes", strings.Join(wk.Lanes, ","))
	if len(wk.Tags) > 0 {
		row("Tags", sortedPairs(wk.Tags))
	}
	row("Running/max", fmt.Sprintf("%d/%d", wk.CurrentInvocations, wk.MaxConcurrency))
	row("Last seen", timestamp(now, wk.LastSeenAt))
	row("Created", timestamp(now, &wk.CreatedAt))
	if wk.RetiredAt != nil {
		row("Retired", timestamp(now, wk.RetiredAt))
	}
	if r := wk.LastSetupResult; r != nil {
		row("Last setup", fmt.Sprintf("%s %s exit %d in %s", setupName(r, 0), r.Status, r.ExitCode,
			time.Duration(r.DurationMS)*time.Millisecond))
		if note := setupNote(r, 0); note != "" {
			switch {
			case r.CommandID == "" && adoptionFailed(wk):
				note += " (a host setup it was asked to adopt: it stays generic and takes generic work)"
			case r.CommandID == "" && wk.State != "gone":
				note += " (its host setup: it claims nothing until a `lakeshore setup` command repairs it, or its keep-alive ends it)"
			}
			row("Note", note)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r := wk.LastSetupResult; r != nil && r.Status == wire.SetupFailed && r.OutputTail != "" {
		fmt.Fprintf(w, "--- setup output (tail) ---\n%s", block(r.OutputTail))
		if !strings.HasSuffix(r.OutputTail, "\n") {
			fmt.Fprintln(w)
		}
	}
	return nil
}

// setupName names what a setup result is for: a control-plane command by its
// id, a --host-setup command by its shell text in backquotes, on one line and
// clipped to max runes (0: whole).
func setupName(r *wire.SetupResult, max int) string {
	if r.CommandID != "" || r.Command == "" {
		return dash(r.CommandID)
	}
	text := strings.Join(strings.Fields(r.Command), " ")
	if runes := []rune(text); max > 0 && len(runes) > max {
		text = string(runes[:max]) + "…"
	}
	return "`" + cell(text) + "`"
}

// workerNote is the NOTE of a worker's row: a failed setup, else why it
// reads stale or gone, clipped.
func workerNote(wk wire.Worker) string {
	if note := setupNote(wk.LastSetupResult, 40); note != "" {
		if adoptionFailed(wk) {
			note = "adoption " + note
		}
		return note
	}
	why := []rune(cell(wk.StateWhy))
	if len(why) > 120 {
		return string(why[:120]) + "…"
	}
	if len(why) == 0 && wk.Adoption != nil && wk.Adoption.Failed == "" {
		return "adopting host key " + clipKey(wk.Adoption.HostKey)
	}
	return string(why)
}

// adoptionFailed reports whether wk is a generic worker whose last
// adoption failed (its last setup result is that failure).
func adoptionFailed(wk wire.Worker) bool {
	return wk.Adoption != nil && wk.Adoption.Failed != "" && wk.HostKey == ""
}

// clipKey shortens a host key for a table cell: hk1_ and 12 hex digits.
func clipKey(k string) string {
	if len(k) > 16 {
		return k[:16] + "…"
	}
	return k
}

// setupNote says why a worker needs an operator, from its last setup result:
// "" unless that failed.
func setupNote(r *wire.SetupResult, max int) string {
	if r == nil || r.Status != wire.SetupFailed {
		return ""
	}
	return fmt.Sprintf("setup failed: %s exit %d", setupName(r, max), r.ExitCode)
}

// invocationTable writes invocations as the `ls invocations` table.
func invocationTable(w io.Writer, invs []wire.Invocation, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tQUEUE\tSTATE\tATTEMPT\tWORKER\tEXIT\tAGE")
	for _, inv := range invs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", inv.InvocationID, inv.Queue, inv.State,
			inv.Attempt, inv.MaxAttempts, dash(inv.WorkerID), exitCode(inv.ExitCode), age(now, inv.CreatedAt))
	}
	return tw.Flush()
}

// attemptTable writes an invocation's attempt history, one line per
// attempt: how it ended is its outcome, or why it was taken back, and
// "(recorded)" marks the attempt whose outcome is the invocation's.
func attemptTable(w io.Writer, as []wire.Attempt, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ATTEMPT\tWORKER\tCLAIMED\tENDED\tHOW\tEXIT\tWHY")
	for _, a := range as {
		how := a.Outcome
		switch {
		case how == "":
			how = "running"
		case a.Recorded:
			how += " (recorded)"
		case a.Retried:
			how += " (retried)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, a.WorkerID, ago(now, &a.ClaimedAt),
			ago(now, a.EndedAt), how, exitCode(a.ExitCode), dash(a.Reason))
	}
	return tw.Flush()
}

// workerTable writes workers as the `ls workers` table.
func workerTable(w io.Writer, ws []wire.Worker, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tLABEL\tSTATE\tPHASE\tHOST\tRUNNING/MAX\tLAST SEEN\tNOTE")
	for _, wk := range ws {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", wk.WorkerID, dash(wk.Label), wk.State, dash(wk.Phase),
			dash(wk.HostStatus), wk.CurrentInvocations, wk.MaxConcurrency, ago(now, wk.LastSeenAt),
			workerNote(wk))
	}
	return tw.Flush()
}

// setupTable writes a worker's setup commands.
func setupTable(w io.Writer, res wire.SetupResults, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "COMMAND\tSTATUS\tEXIT\tDURATION\tAGE\tARGV")
	for _, c := range res.SetupResults {
		dur := "-"
		if c.FinishedAt != nil {
			dur = (time.Duration(c.DurationMS) * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.CommandID, c.Status, exitCode(c.ExitCode), dur,
			age(now, c.CreatedAt), shellJoin(c.Argv))
	}
	return tw.Flush()
}

// joinInts writes exit statuses as "1,75".
func joinInts(codes []int) string {
	s := make([]string, len(codes))
	for i, c := range codes {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// retryText describes a retry policy in words.
func retryText(p *wire.RetryPolicy) string {
	var on []string
	if len(p.ExitCodes) > 0 {
		on = append(on, "exit "+joinInts(p.ExitCodes))
	}
	if p.Timeout {
		on = append(on, "timeout")
	}
	return fmt.Sprintf("on %s, after %s doubling", strings.Join(on, " or "), time.Duration(p.BackoffS)*time.Second)
}

// hostTable writes the provisioner's hosts as the `ls hosts` table.
func hostTable(w io.Writer, hosts []wire.Host, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "HOST\tQUEUE\tHOST KEY\tSTATE\tINSTANCE\tMARKET\tAGE\tWHY")
	for _, h := range hosts {
		key := h.HostKey
		if len(key) > 12 {
			key = key[:12] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.HostID, h.Queue, dash(key), h.State, dash(h.InstanceID),
			dash(h.Market), age(now, h.CreatedAt), dash(h.Reason))
	}
	return tw.Flush()
}
