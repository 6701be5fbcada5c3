// Package rie runs built Lambda `bootstrap` binaries under the AWS Lambda
// Runtime Interface Emulator (aws-lambda-rie, what `sam local` runs inside
// its container) and invokes them, so `lakeshore dev --lambdas` and the tests
// drive the real artifacts that `sam deploy` ships.
//
// One emulator runs one invocation at a time, as one Lambda execution
// environment does. A Pool therefore starts emulators on demand, up to a
// concurrency limit, and hands each invocation to an idle one: concurrent
// long polls from several daemons scale out the way Lambda scales out
// execution environments. An invocation that finds none idle starts one
// and takes whichever comes free first, so a burst waits for the busy
// emulators' answers rather than for a cold start; and a pool may start
// some ahead (Function.Warm).
package rie

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// invokePath is the emulator's invoke endpoint (the Lambda Invoke API path).
const invokePath = "/2015-03-31/functions/function/invocations"

// startTimeout bounds how long a new emulator may take to accept connections.
const startTimeout = 10 * time.Second

// ErrNotInstalled is returned by Find when no emulator binary is found.
var ErrNotInstalled = errors.New("aws-lambda-rie is not installed (make tools installs it with go install)")

// Find returns the path of aws-lambda-rie: on PATH, else in GOPATH/bin
// (where `make tools` installs it).
func Find() (string, error) {
	if p, err := exec.LookPath("aws-lambda-rie"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
			gopath = strings.TrimSpace(string(out))
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		p := filepath.Join(dir, "bin", "aws-lambda-rie")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNotInstalled
}

// Function is one Lambda function to run under the emulator.
type Function struct {
	// Name labels log lines and errors ("hello", "poll", …).
	Name string
	// Bootstrap is the path of the built binary.
	Bootstrap string
	// Emulator is the path of aws-lambda-rie (see Find).
	Emulator string
	// Env is the function's whole environment (as configured on the
	// deployed function); the emulator adds the AWS_LAMBDA_* variables.
	Env []string
	// Timeout is the function timeout (AWS_LAMBDA_FUNCTION_TIMEOUT); zero
	// keeps the emulator's default.
	Timeout time.Duration
	// MaxConcurrency caps the emulators started at once (default 8): the
	// function's reserved concurrency.
	MaxConcurrency int
	// Warm is how many emulators NewPool starts ahead, in the background
	// (at most MaxConcurrency; default none): the first invocations then
	// skip the emulator's own start. The emulator starts the function
	// itself only at its first invocation, so that one still pays the
	// function's INIT, as on Lambda without provisioned concurrency.
	Warm int
	// Logs receives the emulator's and the function's output, each line
	// prefixed with "[name#n] "; nil discards it.
	Logs io.Writer
}

// FunctionError is a Lambda error answer: the handler returned an error or
// panicked (the emulator's body carries errorType and errorMessage).
type FunctionError struct {
	Function string
	Type     string
	Message  string
}

func (e *FunctionError) Error() string {
	return fmt.Sprintf("lambda %s: %s: %s", e.Function, e.Type, e.Message)
}

// Stats reports what a pool has done.
type Stats struct {
	// Instances is how many emulators have been started.
	Instances int
	// Invocations is how many invocations were answered.
	Invocations int
	// InitMS lists the INIT durations the emulators reported, in
	// milliseconds, in the order they were logged.
	InitMS []float64
}

// Pool runs up to MaxConcurrency emulators of one function.
type Pool struct {
	fn    Function
	idle  chan *instance
	slots chan struct{} // one token per emulator that may still be started

	mu      sync.Mutex
	all     []*instance
	closed  bool
	stats   Stats
	started int
	// starting counts the emulators being started; startEnded is closed
	// (and replaced) each time one start ends or an emulator is retired.
	starting   int
	startEnded chan struct{}
}

// NewPool returns a pool that starts emulators of fn on demand.
func NewPool(fn Function) (*Pool, error) {
	if fn.Emulator == "" {
		return nil, fmt.Errorf("lambda %s: no emulator path", fn.Name)
	}
	if st, err := os.Stat(fn.Bootstrap); err != nil {
		return nil, fmt.Errorf("lambda %s: %w", fn.Name, err)
	} else if st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("lambda %s: %s is not executable", fn.Name, fn.Bootstrap)
	}
	if fn.MaxConcurrency <= 0 {
		fn.MaxConcurrency = 8
	}
	if fn.Logs == nil {
		fn.Logs = io.Discard
	}
	p := &Pool{fn: fn, idle: make(chan *instance, fn.MaxConcurrency), slots: make(chan struct{}, fn.MaxConcurrency),
		startEnded: make(chan struct{})}
	for range fn.MaxConcurrency {
		p.slots <- struct{}{}
	}
	p.warm(fn.Warm)
	return p, nil
}

// Invoke sends one event to an idle emulator, starting one if none is idle
// and the limit allows, else waiting for one. It returns the function's
// answer, or a *FunctionError when the function failed.
func (p *Pool) Invoke(ctx context.Context, event []byte) ([]byte, error) {
	in, err := p.acquire(ctx)
	if err != nil {
		return nil, err
	}
	out, err := in.invoke(ctx, event)
	var fe *FunctionError
	if errors.As(err, &fe) {
		fe.Function = p.fn.Name
	} else if err != nil {
		// The emulator itself failed (it died, or the call was cut off):
		// retire it, as Lambda retires a broken execution environment.
		p.discard(in)
		return nil, fmt.Errorf("lambda %s: %w", p.fn.Name, err)
	}
	p.mu.Lock()
	p.stats.Invocations++
	p.mu.Unlock()
	p.release(in)
	return out, err
}

func (p *Pool) acquire(ctx context.Context) (*instance, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("lambda %s: pool closed", p.fn.Name)
	}
	// An idle emulator first: starting one costs a cold start.
	select {
	case in := <-p.idle:
		return in, nil
	default:
	}
	// None idle: start one if none is starting and the limit allows, and
	// take whichever is free first, the new one or one another invocation
	// gives back. An emulator's start (its process, its listening, then
	// the function's INIT) takes far longer than most invocations, so a
	// caller that waited for its own start would pay it even when an
	// emulator came free meanwhile; the one started goes to the idle set
	// instead. One start at a time: on a loaded machine every waiter
	// starting its own would add the load that keeps them waiting (a
	// flood of cold starts), while a pool that grows by one each time its
	// callers still wait reaches the concurrency they need.
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("lambda %s: pool closed", p.fn.Name)
		}
		var started <-chan startResult
		if p.starting == 0 {
			select {
			case <-p.slots:
				started = p.startAsync()
			default:
			}
		}
		ended := p.startEnded
		if started != nil {
			// This caller's own start answers on started; its end must
			// not be taken for another's and the emulator left unread.
			ended = nil
		}
		p.mu.Unlock()
		select {
		case in := <-p.idle:
			p.adopt(started)
			return in, nil
		case r := <-started: // nil (never ready) when none was started
			return r.in, r.err
		case <-ended:
			// Another caller's start ended, or an emulator was
			// retired: look again (an idle emulator, or room to start
			// the next).
		case <-ctx.Done():
			p.adopt(started)
			return nil, fmt.Errorf("lambda %s: waiting for a free instance: %w", p.fn.Name, ctx.Err())
		}
	}
}

// startResult is a started emulator, or why it did not start.
type startResult struct {
	in  *instance
	err error
}

// startAsync starts an emulator on a slot already taken, giving the slot
// back if it fails; p.mu is held. Its end wakes every caller waiting in
// acquire.
func (p *Pool) startAsync() <-chan startResult {
	p.starting++
	ch := make(chan startResult, 1)
	go func() {
		in, err := p.start()
		if err != nil {
			p.slots <- struct{}{}
		}
		ch <- startResult{in, err}
		p.mu.Lock()
		p.starting--
		p.changed()
		p.mu.Unlock()
	}()
	return ch
}

// changed wakes every caller waiting in acquire to look again: a start
// ended, or an emulator was retired and its slot is free; p.mu is held.
func (p *Pool) changed() {
	close(p.startEnded)
	p.startEnded = make(chan struct{})
}

// adopt puts the emulator of a start nobody waits for any more into the
// idle set once it is up (nil: no start).
func (p *Pool) adopt(started <-chan startResult) {
	if started == nil {
		return
	}
	go func() {
		if r := <-started; r.err == nil {
			p.release(r.in)
		}
	}()
}

// warm starts n emulators ahead, at once, each going to the idle set once
// it listens (Function.Warm).
func (p *Pool) warm(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for range n {
		select {
		case <-p.slots:
			p.adopt(p.startAsync())
		default:
			return
		}
	}
}

func (p *Pool) release(in *instance) {
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.idle <- in // never blocks: it holds one place per emulator
	}
	p.mu.Unlock()
	if closed {
		in.kill()
	}
}

func (p *Pool) discard(in *instance) {
	in.kill()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.all {
		if x == in {
			p.all = append(p.all[:i], p.all[i+1:]...)
			break
		}
	}
	p.slots <- struct{}{}
	p.changed()
}

// Stats reports the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.InitMS = append([]float64(nil), p.stats.InitMS...)
	return s
}

// Close stops every emulator; invocations under way fail.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	all := p.all
	p.all = nil
	p.mu.Unlock()
	for _, in := range all {
		in.kill()
	}
}

// instance is one emulator process and its function.
type instance struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
	// release gives its ports back to the process (ports).
	release func()
}

var initReport = regexp.MustCompile(`INIT REPORT\(durationMs: ([0-9.]+)\)`)

// startTries bounds the emulators one start launches: one that exits at
// start-up (a port of its taken by another process meanwhile) is replaced
// by one on other ports.
const startTries = 3

func (p *Pool) start() (*instance, error) {
	var err error
	for range startTries {
		var in *instance
		if in, err = p.startOne(); err == nil || !errors.Is(err, errExitedAtStart) {
			return in, err
		}
	}
	return nil, err
}

// errExitedAtStart: the emulator exited before it listened.
var errExitedAtStart = errors.New("aws-lambda-rie exited at start-up (see its log lines)")

func (p *Pool) startOne() (*instance, error) {
	p.mu.Lock()
	p.started++
	n := p.started
	p.mu.Unlock()

	addrs, release, err := ports.take(2)
	if err != nil {
		return nil, fmt.Errorf("lambda %s: %w", p.fn.Name, err)
	}
	addr, apiAddr := addrs[0], addrs[1]
	cmd := exec.Command(p.fn.Emulator, "--runtime-interface-emulator-address", addr,
		"--runtime-api-address", apiAddr, p.fn.Bootstrap)
	cmd.Env = append([]string{}, p.fn.Env...)
	if p.fn.Timeout > 0 {
		cmd.Env = append(cmd.Env, "AWS_LAMBDA_FUNCTION_TIMEOUT="+strconv.Itoa(int(p.fn.Timeout.Seconds())))
	}
	cmd.Env = append(cmd.Env, "AWS_LAMBDA_FUNCTION_NAME="+p.fn.Name)
	out := &lineWriter{prefix: fmt.Sprintf("[%s#%d] ", p.fn.Name, n), w: p.fn.Logs, line: func(l string) {
		if m := initReport.FindStringSubmatch(l); m != nil {
			if ms, err := strconv.ParseFloat(m[1], 64); err == nil {
				p.mu.Lock()
				p.stats.InitMS = append(p.stats.InitMS, ms)
				p.mu.Unlock()
			}
		}
	}}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so kill reaches the bootstrap too; and killed
	// with its parent, so no emulator outlives `lakeshore dev` or a test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		release()
		return nil, fmt.Errorf("lambda %s: start aws-lambda-rie: %w", p.fn.Name, err)
	}
	in := &instance{url: "http://" + addr + invokePath, cmd: cmd, done: make(chan struct{}), release: release}
	go func() { _ = cmd.Wait(); out.flush(); close(in.done) }()
	if err := in.waitListening(addr); err != nil {
		in.kill()
		return nil, fmt.Errorf("lambda %s: %w", p.fn.Name, err)
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.all = append(p.all, in)
		p.stats.Instances++
	}
	p.mu.Unlock()
	if closed {
		in.kill()
		return nil, fmt.Errorf("lambda %s: pool closed", p.fn.Name)
	}
	return in, nil
}

func (in *instance) waitListening(addr string) error {
	deadline := time.Now().Add(startTimeout)
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			// What answered must be this emulator, not another process
			// on a port this one failed to bind: it must still run.
			select {
			case <-in.done:
				return errExitedAtStart
			case <-time.After(50 * time.Millisecond):
			}
			select {
			case <-in.done:
				return errExitedAtStart
			default:
				return nil
			}
		}
		select {
		case <-in.done:
			return errExitedAtStart
		case <-time.After(delay):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("aws-lambda-rie did not listen on %s within %s", addr, startTimeout)
		}
	}
}

// invoke posts event to the emulator. The emulator answers 200 with the
// handler's result, or with an error object when the handler failed.
func (in *instance) invoke(ctx context.Context, event []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.url, bytes.NewReader(event))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("invoke: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("invoke: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("invoke: emulator answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	if fe := functionError(body); fe != nil {
		return nil, fe
	}
	return body, nil
}

// functionError recognises the emulator's error answer: a JSON object with
// errorType/errorMessage and nothing a handler result would carry.
func functionError(body []byte) *FunctionError {
	var e struct {
		Type    string `json:"errorType"`
		Message string `json:"errorMessage"`
	}
	if json.Unmarshal(body, &e) != nil || (e.Type == "" && e.Message == "") {
		return nil
	}
	return &FunctionError{Type: e.Type, Message: e.Message}
}

func (in *instance) kill() {
	if in.cmd.Process != nil {
		_ = syscall.Kill(-in.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-in.done
	if in.release != nil {
		in.release()
	}
}

// portSet hands out loopback ports to the emulators of this process: each
// was free a moment ago, and none is handed out twice while an emulator
// holds it. An emulator binds its ports only after it starts, so a port
// picked and let go could otherwise be picked again by another start in
// that gap (32 emulators starting at once in a flood): two emulators on one
// port, one of them invoked by two pools' calls at once.
type portSet struct {
	mu   sync.Mutex
	held map[string]bool
	// listen picks a free port (net.Listen; tests replace it).
	listen func() (net.Listener, error)
}

var ports = &portSet{held: map[string]bool{}, listen: func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }}

// portTries bounds the picks of one take.
const portTries = 100

// take returns n loopback addresses no emulator of this process holds, and
// the func that gives them back.
func (s *portSet) take(n int) ([]string, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var addrs []string
	giveBack := func() {
		for _, a := range addrs {
			delete(s.held, a)
		}
	}
	for try := 0; len(addrs) < n; try++ {
		if try == portTries {
			giveBack()
			return nil, nil, fmt.Errorf("find %d free ports: only %d in %d tries", n, len(addrs), portTries)
		}
		ln, err := s.listen()
		if err != nil {
			giveBack()
			return nil, nil, fmt.Errorf("find a free port: %w", err)
		}
		a := ln.Addr().String()
		ln.Close()
		if s.held[a] {
			continue
		}
		s.held[a] = true
		addrs = append(addrs, a)
	}
	var once sync.Once
	return addrs, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			giveBack()
		})
	}, nil
}

// lineWriter prefixes each line written to w and reports it to line.
type lineWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	line   func(string)
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

func (l *lineWriter) emit(s string) {
	l.line(s)
	_, _ = io.WriteString(l.w, l.prefix+s+"\n")
}

var _ io.Writer = (*lineWriter)(nil)
