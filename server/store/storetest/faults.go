package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Fault is what a FaultyTransport does to one request to DynamoDB (or
// another AWS API: EC2). A real service (and the network in front of it)
// does each of these: the point of
// the last three is that the client sees an error although the write
// happened.
type Fault int

const (
	// NoFault sends the request and hands back the answer.
	NoFault Fault = iota
	// FailBefore never sends the request: the client sees a connection
	// error and nothing was applied.
	FailBefore
	// FailAfter sends the request (it is applied), then answers 500
	// InternalServerError in its place.
	FailAfter
	// DropAfter sends the request (it is applied), then drops the
	// connection: the client sees a connection reset instead of the answer.
	DropAfter
	// Delay holds the request past the client's timeout and sends it only
	// then: the client gives up (and may retry) while the write lands later.
	Delay
)

// String names f as the fault log and test failures show it.
func (f Fault) String() string {
	switch f {
	case NoFault:
		return "none"
	case FailBefore:
		return "fail-before"
	case FailAfter:
		return "fail-after(500)"
	case DropAfter:
		return "drop-after"
	case Delay:
		return "delay"
	default:
		return "fault(" + strconv.Itoa(int(f)) + ")"
	}
}

// Call identifies one request: the DynamoDB operation (e.g.
// "TransactWriteItems"), how many requests of that operation came before it
// plus one (N), and how many requests of any kind (Seq, 1-based).
type Call struct {
	Op  string
	N   int
	Seq int
	// Table is the table the request names at its top level ("" for one
	// that names several, as a transaction does).
	Table string
}

// Schedule decides each request's fault.
type Schedule func(Call) Fault

// Never injects nothing.
func Never() Schedule { return func(Call) Fault { return NoFault } }

// Nth injects f into the n-th request of op (e.g. the 3rd
// TransactWriteItems) and nothing else.
func Nth(op string, n int, f Fault) Schedule {
	return func(c Call) Fault {
		if c.Op == op && c.N == n {
			return f
		}
		return NoFault
	}
}

// Random injects one of faults (uniformly) into a request with probability
// rate, drawn from a generator seeded with seed: the same seed and the same
// sequence of requests give the same faults, so a failing run can be
// replayed. Without faults it draws from every kind.
func Random(seed uint64, rate float64, faults ...Fault) Schedule {
	if len(faults) == 0 {
		faults = []Fault{FailBefore, FailAfter, DropAfter, Delay}
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func(Call) Fault {
		mu.Lock()
		defer mu.Unlock()
		if rng.Float64() >= rate {
			return NoFault
		}
		return faults[rng.IntN(len(faults))]
	}
}

// Injected is one fault that was injected.
type Injected struct {
	Call
	Fault Fault
}

// String renders i for logs: "TransactWriteItems#3 (seq 17): fail-after(500)".
func (i Injected) String() string {
	return fmt.Sprintf("%s#%d (seq %d): %s", i.Op, i.N, i.Seq, i.Fault)
}

// FaultyTransport is an http.RoundTripper in front of a DynamoDB endpoint
// (the embedded store, moto) that injects faults by a Schedule. Use it
// through FaultyClient.
type FaultyTransport struct {
	// Base sends the requests that are sent (nil: http.DefaultTransport).
	Base http.RoundTripper
	// Hold is how long a Delay fault holds a request before sending it
	// (zero: 2 s). It must exceed the client's timeout.
	Hold time.Duration

	mu       sync.Mutex
	schedule Schedule
	seq      int
	perOp    map[string]int
	injected []Injected
	late     int        // delayed requests not yet landed
	landed   *sync.Cond // signalled (on mu) as late falls
}

// NewFaultyTransport returns a transport injecting faults by s (nil: Never).
func NewFaultyTransport(s Schedule) *FaultyTransport {
	t := &FaultyTransport{perOp: map[string]int{}}
	t.landed = sync.NewCond(&t.mu)
	t.SetSchedule(s)
	return t
}

// SetSchedule replaces the schedule (nil: Never); call counts go on.
func (t *FaultyTransport) SetSchedule(s Schedule) {
	if s == nil {
		s = Never()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.schedule = s
}

// Next injects faults, in order, into the next len(faults) requests of op
// counted from now, and nothing else: Next("TransactWriteItems", FailAfter)
// loses the answer of the next transaction, and with three faults also its
// SDK retries (each attempt is a request).
func (t *FaultyTransport) Next(op string, faults ...Fault) {
	t.nextWhere(func(c Call) bool { return c.Op == op }, faults)
}

// NextIn is Next for the requests of op to table only: NextIn("PutItem",
// invocations, DropAfter) loses the answer of the next put of an
// invocation, whatever other puts come first.
func (t *FaultyTransport) NextIn(op, table string, faults ...Fault) {
	t.nextWhere(func(c Call) bool { return c.Op == op && c.Table == table }, faults)
}

// nextWhere injects faults, in order, into the next len(faults) requests
// that match, and nothing else.
func (t *FaultyTransport) nextWhere(match func(Call) bool, faults []Fault) {
	faults = append([]Fault(nil), faults...)
	seen := 0 // the schedule runs under t.mu
	t.SetSchedule(func(c Call) Fault {
		if seen >= len(faults) || !match(c) {
			return NoFault
		}
		seen++
		return faults[seen-1]
	})
}

// Injected lists the faults injected so far, in order.
func (t *FaultyTransport) Injected() []Injected {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Injected(nil), t.injected...)
}

// Settle waits until every delayed request has landed (or failed), so what
// a test reads next includes them.
// It may be called while requests are still being sent.
func (t *FaultyTransport) Settle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.late > 0 {
		t.landed.Wait()
	}
}

// dynamoTargetPrefix precedes the operation in a DynamoDB request's
// X-Amz-Target header.
const dynamoTargetPrefix = "DynamoDB_20120810."

// identify names req's API operation and the table it names at its top
// level ("" for none, or several, as a transaction does), reading its body
// once and putting it back. DynamoDB's operation is in its X-Amz-Target
// header and its table in its JSON body; a query-protocol API's (EC2:
// "RunInstances") is the Action of its form body.
func identify(req *http.Request) (op, table string, err error) {
	target := req.Header.Get("X-Amz-Target")
	if req.Body == nil {
		return strings.TrimPrefix(target, dynamoTargetPrefix), "", nil
	}
	body, err := readBody(req)
	if err != nil {
		return "", "", err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if target == "" {
		form, _ := url.ParseQuery(string(body))
		return form.Get("Action"), "", nil
	}
	var named struct{ TableName string }
	_ = json.Unmarshal(body, &named) // not JSON: names no table
	return strings.TrimPrefix(target, dynamoTargetPrefix), named.TableName, nil
}

// RoundTrip sends req, or not, by the schedule.
func (t *FaultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	op, table, err := identify(req)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.seq++
	t.perOp[op]++
	call := Call{Op: op, N: t.perOp[op], Seq: t.seq, Table: table}
	fault := t.schedule(call)
	if fault != NoFault {
		t.injected = append(t.injected, Injected{Call: call, Fault: fault})
	}
	t.mu.Unlock()

	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	switch fault {
	case FailBefore:
		drain(req)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("injected fault before sending %s: %w", op, syscall.ECONNREFUSED)}
	case FailAfter, DropAfter:
		resp, err := base.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if fault == DropAfter {
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("injected fault after %s was applied: %w", op, syscall.ECONNRESET)}
		}
		return internalServerError(req), nil
	case Delay:
		return t.delay(base, req, op)
	default:
		return base.RoundTrip(req)
	}
}

// delay sends a copy of req after Hold, detached from req's context, and
// answers req with its context's error once the client gives up.
func (t *FaultyTransport) delay(base http.RoundTripper, req *http.Request, op string) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	hold := t.Hold
	if hold <= 0 {
		hold = 2 * time.Second
	}
	late := req.Clone(context.Background())
	// http.Client cancels a timed-out request through the deprecated
	// Cancel channel when the transport is not its own; the clone shares
	// it, and would be dropped unsent.
	late.Cancel = nil
	late.Body = io.NopCloser(bytes.NewReader(body))
	late.ContentLength = int64(len(body))
	late.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	t.mu.Lock()
	t.late++
	t.mu.Unlock()
	go func() {
		defer func() {
			t.mu.Lock()
			t.late--
			t.landed.Broadcast()
			t.mu.Unlock()
		}()
		time.Sleep(hold)
		if resp, err := base.RoundTrip(late); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	select {
	case <-req.Context().Done():
		return nil, req.Context().Err()
	case <-time.After(hold):
		// A client without a timeout: fail it all the same, as a read
		// timeout would, while the write lands.
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("injected delay of %s: %w", op, syscall.ETIMEDOUT)}
	}
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil {
		return nil, nil
	}
	defer req.Body.Close()
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, fmt.Errorf("faulty transport: read request body: %w", err)
	}
	return b, nil
}

func drain(req *http.Request) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
}

// internalServerError is DynamoDB's answer to a request it failed on its
// side, as the SDK reads it (retryable).
func internalServerError(req *http.Request) *http.Response {
	body := []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected fault: applied, then answered 500"}`)
	h := http.Header{}
	h.Set("Content-Type", "application/x-amz-json-1.0")
	h.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	return &http.Response{
		Status: "500 Internal Server Error", StatusCode: http.StatusInternalServerError,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		Request: req,
	}
}

// FaultyClient returns a DynamoDB client for endpoint whose requests go
// through t, with timeout per HTTP attempt (zero: none; a Delay fault needs
// one shorter than t.Hold). It retries as the SDK's standard retryer does in
// production (3 attempts, the same errors retryable) but without backoff
// sleeps or a retry quota, so a test with many faults runs fast and never
// runs out of retry tokens.
func FaultyClient(endpoint string, t *FaultyTransport, timeout time.Duration) *dynamodb.Client {
	cfg := aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
		HTTPClient:  &http.Client{Transport: t, Timeout: timeout},
		Retryer: func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil })
				o.RateLimiter = ratelimit.None
			})
		},
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
	})
}

// ErrInjected reports whether err came from an injected fault (as far as
// the client's error lets one tell): a test that counts errors uses it.
func ErrInjected(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "injected") || errors.Is(err, context.DeadlineExceeded))
}
