// Package client is a typed Go client for the whole wire API (docs/design.md §3):
// the daemon routes (hello, poll, ack, bye) and the operator routes. The
// operator CLI, the tests and the nymph agent all talk to the control plane
// through it, so the paths, status codes and error shapes are spelled once.
//
// A Client holds one bearer token. The daemon uses two clients: one with the
// enrollment token for hello, one (WithToken) with the per-worker token hello
// returned for everything after. The client never retries: a caller knows
// whether a request is safe to repeat (acks are, submits only with an
// idempotency key) and how long to keep trying.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// DefaultUserAgent is sent when Client.UserAgent is empty.
const DefaultUserAgent = "lakeshore-client/1"

// maxErrorBody bounds how much of an error answer is read: enough for any
// JSON error the control plane writes, and for a clipped proxy page.
const maxErrorBody = 64 << 10

// clipErrorBody is how much of a non-JSON error body goes into the message.
const clipErrorBody = 200

// Client talks to one control plane with one bearer token. Its fields may be
// set directly or through New; a Client is safe for concurrent use as long
// as its fields are not changed while requests run.
type Client struct {
	// BaseURL is the control plane's root, e.g. http://127.0.0.1:3000 or an
	// API Gateway stage URL; routes are appended to it.
	BaseURL string
	// Token is sent as Authorization: Bearer. It never appears in errors.
	Token string
	// HTTP sends the requests; nil means http.DefaultClient. Deadlines come
	// from each call's context, so no client-wide timeout is needed (a long
	// poll legitimately waits up to 20 s).
	HTTP *http.Client
	// UserAgent is the User-Agent header; empty means DefaultUserAgent.
	UserAgent string
}

// Option configures a Client built by New.
type Option func(*Client)

// WithHTTPClient makes the client send through hc.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.HTTP = hc } }

// WithUserAgent sets the User-Agent header, e.g. "nymph/1.2.3".
func WithUserAgent(ua string) Option { return func(c *Client) { c.UserAgent = ua } }

// New returns a client for the control plane at baseURL that authenticates
// with token.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{BaseURL: baseURL, Token: token}
	for _, o := range opts {
		o(c)
	}
	return c
}

// WithToken returns a copy of c that sends tok instead of c's token; the
// daemon calls it with the worker token hello returned.
func (c *Client) WithToken(tok string) *Client {
	cp := *c
	cp.Token = tok
	return &cp
}

// Hello registers a daemon (POST /v1/daemon/hello). The client's token must
// be the enrollment token.
func (c *Client) Hello(ctx context.Context, req wire.HelloRequest) (wire.HelloResponse, error) {
	var out wire.HelloResponse
	_, err := c.Do(ctx, "hello", http.MethodPost, "/v1/daemon/hello", nil, req, &out)
	return out, err
}

// Poll sends a heartbeat and collects commands (POST /v1/daemon/poll). It
// may block up to the poll's timeout_s (capped by the control plane) while
// the control plane waits for work; give ctx room for that.
func (c *Client) Poll(ctx context.Context, req wire.PollRequest) (wire.PollResponse, error) {
	var out wire.PollResponse
	_, err := c.Do(ctx, "poll", http.MethodPost, "/v1/daemon/poll", nil, req, &out)
	return out, err
}

// Ack reports one attempt's outcome (POST /v1/daemon/ack). Recorded false
// in the answer means an earlier outcome had already won.
func (c *Client) Ack(ctx context.Context, req wire.AckRequest) (wire.AckResponse, error) {
	var out wire.AckResponse
	_, err := c.Do(ctx, "ack", http.MethodPost, "/v1/daemon/ack", nil, req, &out)
	return out, err
}

// ShipLogs sends new output of the worker's attempts (POST /v1/daemon/logs).
func (c *Client) ShipLogs(ctx context.Context, req wire.LogsRequest) (wire.LogsAccepted, error) {
	var out wire.LogsAccepted
	_, err := c.Do(ctx, "ship logs", http.MethodPost, "/v1/daemon/logs", nil, req, &out)
	return out, err
}

// Logs reads one page of an attempt's output from seq after on (GET
// /v1/invocations/{id}/logs); attempt 0 is the latest.
func (c *Client) Logs(ctx context.Context, id string, attempt, after int) (wire.LogPage, error) {
	q := query("attempt", positive(attempt), "after", positive(after))
	var out wire.LogPage
	_, err := c.Do(ctx, "read logs", http.MethodGet, "/v1/invocations/"+url.PathEscape(id)+"/logs", q, nil, &out)
	return out, err
}

// LogsTail reads the last n chunks of an attempt's output, in order (GET
// /v1/invocations/{id}/logs?tail=N); attempt 0 is the latest. The page's
// Next follows the output on, with Logs.
func (c *Client) LogsTail(ctx context.Context, id string, attempt, n int) (wire.LogPage, error) {
	q := url.Values{"tail": {strconv.Itoa(n)}}
	if attempt > 0 {
		q.Set("attempt", strconv.Itoa(attempt))
	}
	var out wire.LogPage
	_, err := c.Do(ctx, "read logs", http.MethodGet, "/v1/invocations/"+url.PathEscape(id)+"/logs", q, nil, &out)
	return out, err
}

// ListHosts reads the hosts the provisioner launched (GET /v1/hosts).
func (c *Client) ListHosts(ctx context.Context) (wire.HostList, error) {
	var out wire.HostList
	_, err := c.Do(ctx, "list hosts", http.MethodGet, "/v1/hosts", nil, nil, &out)
	return out, err
}

// ReleaseHold lets a key whose hosts failed launch again (POST
// /v1/hosts/release).
func (c *Client) ReleaseHold(ctx context.Context, req wire.ReleaseHoldRequest) (wire.HoldReleased, error) {
	var out wire.HoldReleased
	_, err := c.Do(ctx, "release a hold", http.MethodPost, "/v1/hosts/release", nil, req, &out)
	return out, err
}

// Bye tells the control plane the daemon is leaving (POST /v1/daemon/bye).
func (c *Client) Bye(ctx context.Context, req wire.ByeRequest) error {
	_, err := c.Do(ctx, "bye", http.MethodPost, "/v1/daemon/bye", nil, req, nil)
	return err
}

// Submit queues an invocation (POST /v1/invocations). created is true for a
// new invocation (201) and false when the idempotency key replayed an
// earlier one (200).
func (c *Client) Submit(ctx context.Context, req wire.SubmitRequest) (inv wire.Invocation, created bool, err error) {
	status, err := c.Do(ctx, "submit", http.MethodPost, "/v1/invocations", nil, req, &inv)
	return inv, status == http.StatusCreated, err
}

// GetInvocation reads one invocation (GET /v1/invocations/{id}).
func (c *Client) GetInvocation(ctx context.Context, id string) (wire.Invocation, error) {
	var out wire.Invocation
	_, err := c.Do(ctx, "get invocation", http.MethodGet, "/v1/invocations/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// ListInvocationsParams filters and pages GET /v1/invocations. Zero fields
// are left out of the query (the control plane's defaults apply).
type ListInvocationsParams struct {
	Queue  string
	State  string
	Order  string // wire.OrderOldest or wire.OrderNewest
	Limit  int
	Cursor string
	// IDPrefix keeps the invocations whose id starts with it (inv_ and
	// the first characters of an id).
	IDPrefix string
}

// ListInvocations reads one page of invocations (GET /v1/invocations).
// A non-empty NextCursor in the answer means there may be more; pass it as
// Cursor. A page may be empty and still carry a cursor (a filtered scan).
func (c *Client) ListInvocations(ctx context.Context, p ListInvocationsParams) (wire.InvocationList, error) {
	q := query("queue", p.Queue, "state", p.State, "order", p.Order, "limit", positive(p.Limit), "cursor", p.Cursor, "id_prefix", p.IDPrefix)
	var out wire.InvocationList
	_, err := c.Do(ctx, "list invocations", http.MethodGet, "/v1/invocations", q, nil, &out)
	return out, err
}

// CancelInvocation cancels an invocation (POST /v1/invocations/{id}/cancel):
// a queued one is cancelled at once; a running one keeps running until its
// worker's next poll carries the cancel (the answer has cancel_requested).
func (c *Client) CancelInvocation(ctx context.Context, id string) (wire.Invocation, error) {
	var out wire.Invocation
	_, err := c.Do(ctx, "cancel invocation", http.MethodPost, "/v1/invocations/"+url.PathEscape(id)+"/cancel", nil, nil, &out)
	return out, err
}

// ListWorkers reads one page of workers (GET /v1/workers). limit 0 and
// cursor "" leave them to the control plane.
func (c *Client) ListWorkers(ctx context.Context, limit int, cursor string) (wire.WorkerList, error) {
	return c.ListWorkersWhere(ctx, ListWorkersParams{Limit: limit, Cursor: cursor})
}

// ListWorkersParams filters and pages GET /v1/workers. Zero fields are left
// out of the query. A filtered page may hold fewer workers than Limit (the
// filter applies to each page read), and still have a next cursor.
type ListWorkersParams struct {
	State, Label string
	Limit        int
	Cursor       string
}

// ListWorkersWhere reads one page of the workers p selects.
func (c *Client) ListWorkersWhere(ctx context.Context, p ListWorkersParams) (wire.WorkerList, error) {
	q := url.Values{}
	for k, v := range map[string]string{"state": p.State, "label": p.Label, "cursor": p.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if p.Limit > 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	var out wire.WorkerList
	_, err := c.Do(ctx, "list workers", http.MethodGet, "/v1/workers", q, nil, &out)
	return out, err
}

// GetWorker reads one worker (GET /v1/workers/{id}); its state is computed
// by the control plane at read time.
func (c *Client) GetWorker(ctx context.Context, id string) (wire.Worker, error) {
	var out wire.Worker
	_, err := c.Do(ctx, "get worker", http.MethodGet, "/v1/workers/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// DrainWorker asks a worker to drain (POST /v1/workers/{id}/drain); its next
// poll carries a drain command.
func (c *Client) DrainWorker(ctx context.Context, id string) (wire.DrainAccepted, error) {
	var out wire.DrainAccepted
	_, err := c.Do(ctx, "drain worker", http.MethodPost, "/v1/workers/"+url.PathEscape(id)+"/drain", nil, nil, &out)
	return out, err
}

// AddSetup appends a setup command to a worker's FIFO
// (POST /v1/workers/{id}/setup) and reports its command id.
func (c *Client) AddSetup(ctx context.Context, workerID string, argv []string) (wire.SetupAccepted, error) {
	var out wire.SetupAccepted
	_, err := c.Do(ctx, "add setup", http.MethodPost, "/v1/workers/"+url.PathEscape(workerID)+"/setup", nil,
		wire.SetupRequest{Argv: argv}, &out)
	return out, err
}

// SetupResults reads every setup command of a worker and its outcome
// (GET /v1/workers/{id}/setup-results).
func (c *Client) SetupResults(ctx context.Context, workerID string) (wire.SetupResults, error) {
	var out wire.SetupResults
	_, err := c.Do(ctx, "setup results", http.MethodGet, "/v1/workers/"+url.PathEscape(workerID)+"/setup-results", nil, nil, &out)
	return out, err
}

// QueueStats reads a queue's counts by state and its done_count
// (GET /v1/queues/{queue}).
func (c *Client) QueueStats(ctx context.Context, queue string) (wire.QueueStats, error) {
	var out wire.QueueStats
	_, err := c.Do(ctx, "queue stats", http.MethodGet, "/v1/queues/"+url.PathEscape(queue), nil, nil, &out)
	return out, err
}

// Healthz reports whether the control plane and its store answer
// (GET /v1/healthz). It needs no token.
func (c *Client) Healthz(ctx context.Context) (wire.Health, error) {
	var out wire.Health
	_, err := c.Do(ctx, "healthz", http.MethodGet, "/v1/healthz", nil, nil, &out)
	return out, err
}

// Do sends one request and decodes a 2xx answer into out (when out is not
// nil and the answer has a body); it reports the HTTP status. op names the
// call in transport errors ("poll: …"). An error answer comes back as a
// *wire.Error carrying the control plane's code and message, unwrapped, so
// errors.Is(err, wire.ErrWorkerGone) and errors.As both work; its status is
// still reported. in, when not nil, is sent as the JSON body. out may be a
// *json.RawMessage to keep the answer as sent.
func (c *Client) Do(ctx context.Context, op, method, path string, query url.Values, in, out any) (int, error) {
	resp, err := c.send(ctx, op, method, path, query, in, "application/json")
	if err != nil {
		if resp != nil {
			return resp.StatusCode, err
		}
		return 0, err
	}
	defer drainClose(resp)
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return resp.StatusCode, fmt.Errorf("%s: HTTP %d with an empty body", op, resp.StatusCode)
		}
		return resp.StatusCode, fmt.Errorf("%s: decode answer: %w", op, err)
	}
	return resp.StatusCode, nil
}

// drainClose reads a little of what is left of resp's body, so the
// connection can be reused, then closes it.
func drainClose(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	_ = resp.Body.Close()
}

// send sends one request accepting accept and returns a 2xx answer with
// its body open for the caller to read and close (drainClose). An error
// answer is read, closed and returned as a *wire.Error, with the answer
// (body closed) so its status can be reported.
func (c *Client) send(ctx context.Context, op, method, path string, query url.Values, in any, accept string) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("%s: encode request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	u := strings.TrimRight(c.BaseURL, "/") + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	ua := c.UserAgent
	if ua == "" {
		ua = DefaultUserAgent
	}
	req.Header.Set("User-Agent", ua)

	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		// net/http's errors name the method and URL, never the headers, so
		// the token cannot leak through them.
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer drainClose(resp)
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if err != nil && len(b) == 0 {
			return resp, fmt.Errorf("%s: HTTP %d, reading the error answer: %w", op, resp.StatusCode, err)
		}
		return resp, errorFromAnswer(resp.StatusCode, b)
	}
	return resp, nil
}

// errorFromAnswer turns an error answer into a *wire.Error: the control
// plane's own {"error": {code, message}} when the body is one, else a code
// chosen by status (a proxy, load balancer or API Gateway answered) and a
// clipped copy of the body.
func errorFromAnswer(status int, body []byte) *wire.Error {
	var eb wire.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error.Code != "" {
		return &wire.Error{Code: eb.Error.Code, Message: eb.Error.Message, Reason: eb.Error.Reason}
	}
	msg := fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	if s := clip(strings.TrimSpace(string(body))); s != "" {
		msg += ": " + s
	}
	return &wire.Error{Code: wire.CodeForStatus(status), Message: msg}
}

// clip shortens a body quoted in an error message, on a rune boundary and
// with control characters flattened, so one line stays one line.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	cut := false
	if len(s) > clipErrorBody {
		end := clipErrorBody
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
		s, cut = s[:end], true
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if cut {
		s += "…"
	}
	return s
}

// Retryable reports whether err is worth trying again later: a transport
// failure, or an answer saying the control plane or its store is briefly
// unable (5xx, 429). A 4xx answer is not: the same request gets the same
// answer; nor is 501 not_implemented (a feature this control plane is not
// configured for). Context cancellation is not either.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return wire.Status(we.Code) >= 500 && we.Code != wire.CodeNotImplemented
	}
	return true
}

// query is a request's query: each name with its value, leaving out the
// names whose value is "" (pairs: name, value, name, value, …).
func query(pairs ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			q.Set(pairs[i], pairs[i+1])
		}
	}
	return q
}

// positive is n as a query value, "" (left out) unless n > 0.
func positive(n int) string {
	if n <= 0 {
		return ""
	}
	return strconv.Itoa(n)
}
