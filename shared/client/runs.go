package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// maxResultsPage bounds one page of a run's results as read: the control
// plane closes a page past 4 MiB, so a page holds that plus one job's lines
// (a result is at most wire.MaxResultBlobBytes, as records a little more).
const maxResultsPage = 8 << 20

// SubmitRun queues a run of jobs (POST /v1/runs). created is true for a
// new run (201) and false when the idempotency key replayed an earlier
// one (200), which also finishes writing a submit that died midway.
func (c *Client) SubmitRun(ctx context.Context, req wire.RunRequest) (run wire.RunCreated, created bool, err error) {
	status, err := c.Do(ctx, "submit run", http.MethodPost, "/v1/runs", nil, req, &run)
	return run, status == http.StatusCreated, err
}

// Run reads one run's state and counts (GET /v1/runs/{id}).
func (c *Client) Run(ctx context.Context, id string) (wire.Run, error) {
	var out wire.Run
	_, err := c.Do(ctx, "get run", http.MethodGet, "/v1/runs/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// Runs lists every run, newest first, of one queue, or of every queue for
// "", a page (GET /v1/runs) at a time.
func (c *Client) Runs(ctx context.Context, queue string) (wire.RunList, error) {
	var all wire.RunList
	p := RunsParams{Queue: queue, Limit: maxRunsPage}
	for range maxRunsPages {
		page, err := c.RunsPage(ctx, p)
		if err != nil {
			return all, err
		}
		all.Runs = append(all.Runs, page.Runs...)
		if p.Cursor = page.NextCursor; p.Cursor == "" {
			return all, nil
		}
	}
	return all, fmt.Errorf("list runs: more than %d pages", maxRunsPages)
}

// Bounds of Runs: the largest page the control plane serves, and how many
// pages it reads at most.
const (
	maxRunsPage  = 500
	maxRunsPages = 10_000
)

// RunsParams selects a page of runs: of Queue ("" for every queue), at
// most Limit (0: the control plane's default), after Cursor.
type RunsParams struct {
	Queue  string
	Limit  int
	Cursor string
}

// RunsPage reads one page of runs, newest first (GET /v1/runs); its
// NextCursor, when set, reads the next.
func (c *Client) RunsPage(ctx context.Context, p RunsParams) (wire.RunList, error) {
	q := query("queue", p.Queue, "limit", positive(p.Limit), "cursor", p.Cursor)
	var out wire.RunList
	_, err := c.Do(ctx, "list runs", http.MethodGet, "/v1/runs", q, nil, &out)
	return out, err
}

// CancelRun asks for a run's live jobs to be cancelled (POST
// /v1/runs/{id}/cancel). Remaining > 0 in the answer means the request ran
// out of time with jobs still to cancel: call it again.
func (c *Client) CancelRun(ctx context.Context, id string) (wire.RunCancelled, error) {
	var out wire.RunCancelled
	_, err := c.Do(ctx, "cancel run", http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/cancel", nil, nil, &out)
	return out, err
}

// RetryRun queues run id's failed jobs again (POST /v1/runs/{id}/retry):
// one request, which may leave jobs to do (Remaining; call again).
func (c *Client) RetryRun(ctx context.Context, id string) (wire.RunRetried, error) {
	var out wire.RunRetried
	_, err := c.Do(ctx, "retry run", http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/retry", nil, wire.RunRetryRequest{Failed: true}, &out)
	return out, err
}

// RunResultsParams selects a run's results: from the job index From, at
// most Limit jobs a page (0: the control plane's page size), and with
// Records each element of a job's JSON-array result as its own line
// (wire.RunRecord) instead of one wire.RunResult line a job.
type RunResultsParams struct {
	From    int
	Limit   int
	Records bool
}

// RunResultsPage reads one page of a run's results (GET
// /v1/runs/{id}/results): its JSON lines, each checked to be JSON, and the
// first job index of the next page (more false when this page was the
// last).
func (c *Client) RunResultsPage(ctx context.Context, id string, p RunResultsParams) (lines []json.RawMessage, next int, more bool, err error) {
	q := url.Values{}
	if p.From > 0 {
		q.Set("from", strconv.Itoa(p.From))
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Records {
		q.Set("records", "true")
	}
	resp, err := c.send(ctx, "run results", http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/results", q, nil, "application/x-ndjson")
	if err != nil {
		return nil, 0, false, err
	}
	defer drainClose(resp)
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResultsPage+1))
	if err != nil {
		return nil, 0, false, fmt.Errorf("run results of %s from %d: read answer: %w", id, p.From, err)
	}
	if len(body) > maxResultsPage {
		return nil, 0, false, fmt.Errorf("run results of %s from %d: the page is over %d bytes", id, p.From, maxResultsPage)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), maxResultsPage)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if !json.Valid(line) {
			return nil, 0, false, fmt.Errorf("run results of %s from %d: line %d of the page is not JSON", id, p.From, n)
		}
		lines = append(lines, json.RawMessage(bytes.Clone(line)))
	}
	if err := sc.Err(); err != nil {
		return nil, 0, false, fmt.Errorf("run results of %s from %d: %w", id, p.From, err)
	}
	h := resp.Header.Get(wire.NextIndexHeader)
	if h == "" {
		return lines, 0, false, nil
	}
	next, err = strconv.Atoi(h)
	if err != nil || next <= p.From {
		return nil, 0, false, fmt.Errorf("run results of %s from %d: %s %q is no index past the page's first", id, p.From, wire.NextIndexHeader, h)
	}
	return lines, next, true, nil
}

// ErrStop, returned by a RunResults callback, ends the reading early
// without an error.
var ErrStop = errors.New("stop reading")

// RunResults reads a run's results page after page, from p.From until the
// control plane names no next page, and calls each with every line in
// order. Each page starts past the one before, so it ends after at most
// wire.MaxRunJobs pages.
func (c *Client) RunResults(ctx context.Context, id string, p RunResultsParams, each func(line json.RawMessage) error) error {
	for range wire.MaxRunJobs + 1 {
		lines, next, more, err := c.RunResultsPage(ctx, id, p)
		if err != nil {
			return err
		}
		for _, l := range lines {
			if err := each(l); err != nil {
				if errors.Is(err, ErrStop) {
					return nil
				}
				return err
			}
		}
		if !more {
			return nil
		}
		p.From = next
	}
	return fmt.Errorf("run results of %s: more than %d pages", id, wire.MaxRunJobs+1)
}
