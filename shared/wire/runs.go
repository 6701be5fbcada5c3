package wire

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// MaxRunJobs is the most jobs one run holds (domain.MaxRunJobs).
const MaxRunJobs = domain.MaxRunJobs

// MaxRunBodyBytes bounds POST /v1/runs' body: a run's jobs come in one
// request, under a Lambda's 6 MB request payload.
const MaxRunBodyBytes = 5 << 20

// Run states, as GET /v1/runs/{id} reports them.
const (
	RunSubmitting = string(domain.RunSubmitting)
	RunRunning    = string(domain.RunRunning)
	RunDone       = string(domain.RunDone)
)

// RunRequest is POST /v1/runs: a run of jobs on one queue, listed (Jobs)
// or the product of a matrix's axes (Matrix), never both. The run's argv,
// env, run_config, timeout_s, max_attempts, retry and input are every
// job's defaults; a listed job's own fields replace them. In a matrix run,
// "{axis}" in argv (not after a "$", so a shell's ${VAR} is left alone)
// is replaced by the job's value on that axis.
type RunRequest struct {
	Queue          string            `json:"queue"`
	Name           string            `json:"name,omitempty"`
	Argv           []string          `json:"argv,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	RunConfig      RunConfig         `json:"run_config"`
	TimeoutS       int               `json:"timeout_s,omitempty"`
	MaxAttempts    int               `json:"max_attempts,omitempty"`
	Retry          *RetryPolicy      `json:"retry,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// Matrix names the axes whose product is the jobs. Axes are taken in
	// name order, the first varying slowest: job 0 takes every axis's
	// first value.
	Matrix map[string][]string `json:"matrix,omitempty"`
	Jobs   []RunJob            `json:"jobs,omitempty"`
	// expanded holds the jobs Validate made, so RunSpec does not expand
	// and check up to MaxRunJobs again.
	expanded []domain.RunJob
	// Input is every job's input (a listed job's own replaces it). Last,
	// and omitted when unset, so the idempotency hash of a request without
	// it is what it always was.
	Input json.RawMessage `json:"input,omitempty"`
}

// RunJob is one listed job of a run: what it sets replaces the run's.
type RunJob struct {
	Argv        []string          `json:"argv,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	RunConfig   *RunConfig        `json:"run_config,omitempty"`
	TimeoutS    int               `json:"timeout_s,omitempty"`
	MaxAttempts int               `json:"max_attempts,omitempty"`
	Input       json.RawMessage   `json:"input,omitempty"`
}

// axisName is a matrix axis's name: it becomes LAKESHORE_MATRIX_<NAME>.
var axisName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,31}$`)

// placeholder is "{name}" in a matrix run's argv, and what precedes it.
var placeholder = regexp.MustCompile(`(^|[^$])\{([A-Za-z][A-Za-z0-9_]{0,31})\}`)

// MaxAxisValueBytes bounds one value of a matrix axis.
const MaxAxisValueBytes = 1024

// Validate checks r and every job it makes (each as its own submit would
// be checked; an error names the job's index).
func (r *RunRequest) Validate() error {
	jobs, err := r.jobs()
	r.expanded = jobs
	return err
}

// RunSpec is what r asks for, its jobs in index order. Call it on a
// request Decode validated.
func (r RunRequest) RunSpec() domain.RunSpec {
	jobs := r.expanded
	if jobs == nil {
		jobs, _ = r.jobs()
	}
	spec := domain.RunSpec{Queue: r.Queue, Name: r.Name, Jobs: jobs, IdempotencyKey: r.IdempotencyKey}
	if r.IdempotencyKey != "" {
		b, _ := json.Marshal(r)
		spec.RequestHash = hashOf(b)
	}
	return spec
}

// jobs expands r into its jobs, checking each.
func (r *RunRequest) jobs() ([]domain.RunJob, error) {
	if err := checkQueue(r.Queue); err != nil {
		return nil, err
	}
	if err := checkText("name", r.Name, 256, false); err != nil {
		return nil, err
	}
	if err := checkText("idempotency_key", r.IdempotencyKey, MaxIDLen, false); err != nil {
		return nil, err
	}
	if err := checkInput("input", &r.Input); err != nil {
		return nil, err
	}
	switch {
	case r.Matrix != nil && r.Jobs != nil:
		return nil, invalid("a run takes matrix or jobs, not both")
	case r.Matrix != nil:
		return r.matrixJobs()
	case len(r.Jobs) == 0:
		return nil, invalid("a run needs jobs: a non-empty jobs list or a matrix")
	case len(r.Jobs) > MaxRunJobs:
		return nil, invalid("a run holds at most %d jobs; this one lists %d", MaxRunJobs, len(r.Jobs))
	}
	out := make([]domain.RunJob, len(r.Jobs))
	for i, j := range r.Jobs {
		sub := r.defaults()
		if hasInput(j.Input) {
			sub.Input = j.Input
		}
		if j.Argv != nil {
			sub.Argv = j.Argv
		}
		if j.Env != nil {
			sub.Env = j.Env
		}
		if j.RunConfig != nil {
			sub.RunConfig = *j.RunConfig
		}
		if j.TimeoutS != 0 {
			sub.TimeoutS = j.TimeoutS
		}
		if j.MaxAttempts != 0 {
			sub.MaxAttempts = j.MaxAttempts
		}
		spec, err := jobSpec(sub, "jobs[%d]", i)
		if err != nil {
			return nil, err
		}
		out[i] = domain.RunJob{Spec: spec}
	}
	return out, nil
}

// hasInput reports whether in is an input: neither absent nor JSON null
// (a job's null input, like its other fields' null, takes the run's).
func hasInput(in json.RawMessage) bool {
	return len(in) > 0 && string(bytes.TrimSpace(in)) != "null"
}

// defaults is the submit every job starts from.
func (r *RunRequest) defaults() SubmitRequest {
	s := SubmitRequest{Queue: r.Queue, Argv: r.Argv, Env: r.Env, RunConfig: r.RunConfig,
		TimeoutS: r.TimeoutS, MaxAttempts: r.MaxAttempts, Input: r.Input}
	if r.Retry != nil {
		p := *r.Retry
		s.Retry = &p
	}
	return s
}

// jobSpec checks one job's submit as POST /v1/invocations would, the
// error prefixed with where the job is.
func jobSpec(sub SubmitRequest, where string, i int) (domain.Spec, error) {
	if err := sub.Validate(); err != nil {
		return domain.Spec{}, Errorf(CodeOf(err), where+": %s", append([]any{i}, messageOf(err))...)
	}
	return sub.Spec(), nil
}

// messageOf is an error's message without its code.
func messageOf(err error) string {
	if b := BodyFor(err); b.Error.Message != "" {
		return b.Error.Message
	}
	return err.Error()
}

// matrixJobs expands r's matrix: the product of its axes, in name order.
func (r *RunRequest) matrixJobs() ([]domain.RunJob, error) {
	if len(r.Matrix) == 0 {
		return nil, invalid("matrix needs at least one axis")
	}
	names := make([]string, 0, len(r.Matrix))
	upper := map[string]string{}
	total := 1
	for name, values := range r.Matrix {
		if !axisName.MatchString(name) {
			return nil, invalid("matrix axis %q: a name is a letter then letters, digits or _, at most 32", clip(name))
		}
		if prev, ok := upper[strings.ToUpper(name)]; ok {
			return nil, invalid("matrix axes %q and %q are the same axis (both set %s%s)", prev, name, domain.EnvMatrixPrefix, strings.ToUpper(name))
		}
		upper[strings.ToUpper(name)] = name
		if len(values) == 0 {
			return nil, invalid("matrix axis %q has no values", name)
		}
		for _, v := range values {
			if err := checkText("matrix."+name, v, MaxAxisValueBytes, false); err != nil {
				return nil, err
			}
		}
		names = append(names, name)
		total *= len(values)
		if total > MaxRunJobs {
			return nil, invalid("the matrix makes more than %d jobs (the most a run holds)", MaxRunJobs)
		}
	}
	slices.Sort(names)
	for _, a := range r.Argv {
		for _, m := range placeholder.FindAllStringSubmatch(a, -1) {
			if _, ok := r.Matrix[m[2]]; !ok {
				return nil, invalid("argv names {%s}, which is no axis of the matrix (axes: %s)", m[2], strings.Join(names, ", "))
			}
		}
	}
	out := make([]domain.RunJob, total)
	for i := range total {
		axes := make([]domain.Axis, len(names))
		rest := i
		for k := len(names) - 1; k >= 0; k-- {
			values := r.Matrix[names[k]]
			axes[k] = domain.Axis{Name: names[k], Value: values[rest%len(values)]}
			rest /= len(values)
		}
		sub := r.defaults()
		sub.Argv = expand(r.Argv, axes)
		spec, err := jobSpec(sub, "job %d", i)
		if err != nil {
			return nil, err
		}
		out[i] = domain.RunJob{Spec: spec, Axes: axes}
	}
	return out, nil
}

// expand replaces each "{axis}" of argv with the job's value on it.
func expand(argv []string, axes []domain.Axis) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = placeholder.ReplaceAllStringFunc(a, func(m string) string {
			sub := placeholder.FindStringSubmatch(m)
			for _, ax := range axes {
				if ax.Name == sub[2] {
					return sub[1] + ax.Value
				}
			}
			return m
		})
	}
	return out
}

// RunCreated answers POST /v1/runs: 201, or 200 for a replay of the same
// idempotency key (which also finishes writing a submit that died).
type RunCreated struct {
	RunID string `json:"run_id"`
	Total int    `json:"total"`
	State string `json:"state"`
}

// Run is GET /v1/runs/{id}: its state, jobs and counts. Queued and
// running are its live jobs now; succeeded, failed and cancelled its
// terminal ones, each counted once; done_count is their sum.
type Run struct {
	RunID     string         `json:"run_id"`
	Queue     string         `json:"queue"`
	Name      string         `json:"name,omitempty"`
	State     string         `json:"state"`
	Total     int            `json:"total"`
	DoneCount int            `json:"done_count"`
	Counts    map[string]int `json:"counts"`
	CreatedAt string         `json:"created_at"`
}

// RunList is GET /v1/runs: newest first.
type RunList struct {
	Runs []Run `json:"runs"`
	// NextCursor, when set, is the cursor of the next page (GET
	// /v1/runs?cursor=): older runs.
	NextCursor string `json:"next_cursor,omitempty"`
}

// RunResult is one line of GET /v1/runs/{id}/results: job index's state
// and, once its outcome is counted, that attempt's exit code and result.
type RunResult struct {
	Index        int             `json:"index"`
	InvocationID string          `json:"invocation_id"`
	State        string          `json:"state"`
	Attempt      int             `json:"attempt"`
	ExitCode     *int            `json:"exit_code"`
	Result       json.RawMessage `json:"result"`
}

// RunRecord is one line of GET /v1/runs/{id}/results?records=true: one
// element of a job's JSON-array result.
type RunRecord struct {
	Index  int             `json:"index"`
	Record json.RawMessage `json:"record"`
}

// NextIndexHeader names the first job index of the next page of a run's
// results ("" when this page was the last).
const NextIndexHeader = "Lakeshore-Next-Index"

// RunRetryRequest is POST /v1/runs/{id}/retry: which jobs get a new
// attempt. Only the failed ones can be asked for ({"failed": true}).
type RunRetryRequest struct {
	Failed bool `json:"failed"`
}

// Validate refuses a retry that does not name the failed jobs.
func (r *RunRetryRequest) Validate() error {
	if !r.Failed {
		return invalid(`a run's retry queues its failed jobs again: send {"failed": true}`)
	}
	return nil
}

// RunRetried answers POST /v1/runs/{id}/retry: how many failed jobs it
// queued again, and how many jobs it did not get to (call it again).
type RunRetried struct {
	RunID     string `json:"run_id"`
	Retried   int    `json:"retried"`
	Remaining int    `json:"remaining"`
}

// RunCancelled answers POST /v1/runs/{id}/cancel: how many jobs it asked
// to cancel, and how many are still to do if the request ran out of time
// (call it again).
type RunCancelled struct {
	RunID     string `json:"run_id"`
	Cancelled int    `json:"cancelled"`
	Remaining int    `json:"remaining"`
}
