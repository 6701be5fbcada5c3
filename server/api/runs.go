package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Paging of a run's results: at most resultsPageJobs jobs, and a page
// stops once it holds resultsPageBytes (under a Lambda's 6 MB answer).
const (
	resultsPageJobs  = 1000
	resultsPageBytes = 4 << 20
)

// cancelBudget is how long one POST /v1/runs/{id}/cancel works before it
// answers what remains (under API Gateway's 29 s).
const cancelBudget = 20 * time.Second

func (s *Server) submitRun(r *http.Request) (int, any, error) {
	var req wire.RunRequest
	if err := wire.DecodeLimit(r.Body, &req, wire.MaxRunBodyBytes); err != nil {
		return 0, nil, err
	}
	run, created, err := s.svc.SubmitRun(r.Context(), req.RunSpec())
	if err != nil {
		return 0, nil, err
	}
	body := wire.RunCreated{RunID: run.ID, Total: run.Total, State: string(run.State())}
	if !created {
		return http.StatusOK, body, nil
	}
	return http.StatusCreated, body, nil
}

func (s *Server) getRun(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Run)
	if err != nil {
		return 0, nil, err
	}
	st, err := s.svc.Run(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, runView(st), nil
}

func (s *Server) listRuns(r *http.Request) (int, any, error) {
	limit, cursor, err := listParams(r)
	if err != nil {
		return 0, nil, err
	}
	queue := r.URL.Query().Get("queue")
	if queue != "" && !wire.ValidQueue(queue) {
		return 0, nil, wire.Errorf(wire.CodeInvalid, "queue %q is not a queue name", queue)
	}
	runs, next, err := s.svc.Runs(r.Context(), queue, limit, cursor)
	if err != nil {
		return 0, nil, err
	}
	out := wire.RunList{Runs: make([]wire.Run, len(runs)), NextCursor: next}
	for i, st := range runs {
		out.Runs[i] = runView(st)
	}
	return http.StatusOK, out, nil
}

// runView is the operator's view of a run and its counts.
func runView(st control.RunStatus) wire.Run {
	c := st.Counts
	return wire.Run{RunID: st.ID, Queue: st.Queue, Name: st.Name, State: string(st.State()), Total: st.Total,
		DoneCount: c.Done, CreatedAt: st.CreatedAt.UTC().Format(time.RFC3339Nano),
		Counts: map[string]int{
			string(domain.StateQueued): st.Queued, string(domain.StateRunning): st.Running,
			string(domain.StateSucceeded): c.Succeeded, string(domain.StateFailed): c.Failed,
			string(domain.StateCancelled): c.Cancelled,
		}}
}

// runResults answers a page of a run's results as JSON lines, one per job
// in index order (with records=true, one per element of each job's
// JSON-array result); the next page's first index is in
// wire.NextIndexHeader.
func (s *Server) runResults(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Run)
	if err != nil {
		return 0, nil, err
	}
	from, limit, err := runPageParams(r, resultsPageJobs)
	if err != nil {
		return 0, nil, err
	}
	records := r.URL.Query().Get("records") == "true"
	run, jobs, err := s.svc.RunJobs(r.Context(), id, from, limit)
	if err != nil {
		return 0, nil, err
	}
	page := jsonLines{buf: &bytes.Buffer{}}
	next := from + len(jobs)
	for i, inv := range jobs {
		n := page.buf.Len()
		if records {
			for _, rec := range resultRecords(inv) {
				page.add(wire.RunRecord{Index: inv.RunIndex, Record: rec})
			}
		} else {
			page.add(resultLine(inv))
		}
		if page.buf.Len() > resultsPageBytes && i > 0 {
			page.buf.Truncate(n) // this job starts the next page
			next = from + i
			break
		}
	}
	if next < run.Total {
		page.next = strconv.Itoa(next)
	}
	return http.StatusOK, page, nil
}

// resultLine is job inv's line of its run's results: its counted
// attempt's exit code and result, once it has one.
func resultLine(inv domain.Invocation) wire.RunResult {
	line := wire.RunResult{Index: inv.RunIndex, InvocationID: inv.ID, State: string(inv.State), Attempt: inv.CountedAttempt()}
	if inv.State.Terminal() {
		line.ExitCode = inv.ExitCode
		if inv.ResultBlob != "" {
			line.Result = json.RawMessage(inv.ResultBlob)
		}
	}
	return line
}

// resultRecords are the elements of job inv's result when it is a JSON
// array (none otherwise, or while it is not done).
func resultRecords(inv domain.Invocation) []json.RawMessage {
	if !inv.State.Terminal() || inv.ResultBlob == "" {
		return nil
	}
	var recs []json.RawMessage
	if err := json.Unmarshal([]byte(inv.ResultBlob), &recs); err != nil {
		return nil
	}
	return recs
}

func (s *Server) cancelRun(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Run)
	if err != nil {
		return 0, nil, err
	}
	n, remaining, err := s.svc.CancelRun(r.Context(), id, s.clock.Now().Add(cancelBudget))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, wire.RunCancelled{RunID: id, Cancelled: n, Remaining: remaining}, nil
}

func (s *Server) retryRun(r *http.Request) (int, any, error) {
	id, err := pathID(r, ids.Run)
	if err != nil {
		return 0, nil, err
	}
	var req wire.RunRetryRequest
	if err := wire.Decode(r.Body, &req); err != nil {
		return 0, nil, err
	}
	n, remaining, err := s.svc.RetryRun(r.Context(), id, s.clock.Now().Add(cancelBudget))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, wire.RunRetried{RunID: id, Retried: n, Remaining: remaining}, nil
}

// queryInt parses a query parameter as an integer ≥ 0 (def when absent).
func queryInt(v string, def int, name string) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, wire.Errorf(wire.CodeInvalid, "%s must be a whole number ≥ 0", name)
	}
	return n, nil
}

// jsonLines (a daemonapi.Lines) is an answer of JSON lines (application/x-ndjson), with the
// next page's first index in wire.NextIndexHeader when there is one.
type jsonLines struct {
	buf  *bytes.Buffer
	next string
}

func (p jsonLines) add(v any) {
	_ = json.NewEncoder(p.buf).Encode(v) // one line each
}

func (p jsonLines) WriteResponse(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	if p.next != "" {
		w.Header().Set(wire.NextIndexHeader, p.next)
	}
	w.WriteHeader(status)
	_, _ = w.Write(p.buf.Bytes())
}

// runPageParams reads a page of a run's jobs: from (default 0) and limit,
// 1 to most (default most).
func runPageParams(r *http.Request, most int) (from, limit int, err error) {
	q := r.URL.Query()
	if from, err = queryInt(q.Get("from"), 0, "from"); err != nil {
		return 0, 0, err
	}
	if limit, err = queryInt(q.Get("limit"), most, "limit"); err != nil {
		return 0, 0, err
	}
	if limit < 1 || limit > most {
		return 0, 0, wire.Errorf(wire.CodeInvalid, "limit must be 1 to %d", most)
	}
	return from, limit, nil
}
