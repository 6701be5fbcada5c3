package process

// Warm processes serve resident bodies (run_config.resident, docs/warm.md):
// instead of a process per invocation, the runner keeps a process per run
// config alive and hands it invocation after invocation through the
// runtime API (lifecycle.Warm), so what the process loaded once — a
// model's weights — stays for the next body.
//
// A warm process runs like a body: its own session and process group,
// Pdeathsig, a ledger record (so a SIGKILLed daemon's successor kills it),
// the clean environment, --run-as. It starts in a directory of its own,
// <Workdir>/.warm/<id>, and is keyed by its argv, the whole run config and
// its env (processEnv): a process never serves an invocation of another
// run config or env. The pool
// holds at most Config.WarmCapacity of them, one invocation each at a
// time; an idle one is stopped after WarmKeepAlive, or sooner when a
// process of another key needs its place.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// EnvRuntimeAPI names the variable that gives a warm process its runtime
// API.
const EnvRuntimeAPI = "NYMPH_RUNTIME_API"

// DefaultWarmKeepAlive is how long an idle warm process is kept.
const DefaultWarmKeepAlive = 10 * time.Minute

// WarmStartTimeout bounds, for an invocation without timeout_s, how long
// a new warm process may take to ask for its first invocation (its
// on_host_setup hooks included).
const WarmStartTimeout = 15 * time.Minute

// warmExitWait is how long a warm process told to end (410) has to run
// its on_shutdown hooks and exit before it is terminated.
const warmExitWait = 30 * time.Second

// warmDirName is the directory under the workdir where warm processes
// start; retention never touches it (no invocation id has a dot).
const warmDirName = ".warm"

// Error types of resident runs.
const (
	ErrorTypeBodyError       = lifecycle.ErrorTypeBodyError       // the body raised (it posted an error)
	ErrorTypeHostSetupFailed = lifecycle.ErrorTypeHostSetupFailed // the warm process's on_host_setup hooks failed
	// ErrorTypeProcessLost: the warm process died while its body ran. The
	// outcome is abandoned, never acked: the next poll leaves the
	// invocation out, and the control plane hands it out again (attempt +
	// 1) as it does a lost worker's.
	ErrorTypeProcessLost = "process_lost"
)

// RuntimeAPI is where warm processes pull their invocations from
// (lifecycle.Server).
type RuntimeAPI interface {
	AddWarm(group func() int, hostKey, workerID string) (*lifecycle.Warm, error)
}

// pool is the runner's warm processes.
type pool struct {
	r  *Runner
	mu sync.Mutex
	// procs are the live processes, busy or idle; one told to end leaves
	// the list at once.
	procs []*warmProc
	// live are the processes not yet gone, those told to end included.
	live     map[*warmProc]bool
	seq      int
	draining bool // no process is kept once its invocation is answered
}

// warmProc is one warm process.
type warmProc struct {
	id, key string
	api     *lifecycle.Warm
	dir     string
	stdout  *outputSwitch
	stderr  *outputSwitch

	started  chan struct{} // closed once it runs (pgid set) or failed to start
	startErr error
	stopc    chan struct{} // closed to terminate its group
	stopOnce sync.Once
	exited   chan struct{} // closed once it is gone and cleaned up
	res      groupResult   // how it ended; read after exited

	pgidMu sync.Mutex
	pgid   int // 0 before it starts and after it ends

	// Under pool.mu.
	busy      bool
	idleSince time.Time
}

func (p *warmProc) group() int {
	p.pgidMu.Lock()
	defer p.pgidMu.Unlock()
	return p.pgid
}

// stop terminates the process's group (SIGTERM, KillAfter, SIGKILL).
func (p *warmProc) stop() { p.stopOnce.Do(func() { close(p.stopc) }) }

// residentKey is the key a warm process serves: the body's argv, its
// whole run config and its process env.
func residentKey(inv wire.RunInvocation) string {
	b, _ := json.Marshal(struct {
		Argv      []string          `json:"argv"`
		RunConfig wire.RunConfig    `json:"run_config"`
		Env       map[string]string `json:"env"`
	}{inv.Argv, inv.RunConfig, processEnv(inv)})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// processEnv is the part of an invocation's env a warm process starts
// with: all of it but what tells one job of a run from another
// (LAKESHORE_RUN_ID, LAKESHORE_RUN_INDEX, LAKESHORE_MATRIX_*), which is set
// per invocation, so the jobs of a run share their processes.
func processEnv(inv wire.RunInvocation) map[string]string {
	env := map[string]string{}
	for k, v := range inv.Env {
		if k != domain.EnvRunID && k != domain.EnvRunIndex && !strings.HasPrefix(k, domain.EnvMatrixPrefix) {
			env[k] = v
		}
	}
	return env
}

// acquire returns a warm process of inv's key, busy for the caller, with
// its output going to stdout and stderr: an idle one, or a new one (fresh)
// whose start it waits for.
func (w *pool) acquire(inv wire.RunInvocation, workerID string, stdout, stderr *os.File) (p *warmProc, fresh bool, err error) {
	key := residentKey(inv)
	w.mu.Lock()
	for _, q := range w.procs {
		if q.key == key && !q.busy {
			q.busy = true
			w.mu.Unlock()
			q.stdout.set(stdout)
			q.stderr.set(stderr)
			return q, false, nil
		}
	}
	if len(w.procs) >= max(w.r.cfg.WarmCapacity, 1) {
		// Make room: the idle process unused the longest goes.
		var oldest *warmProc
		for _, q := range w.procs {
			if !q.busy && (oldest == nil || q.idleSince.Before(oldest.idleSince)) {
				oldest = q
			}
		}
		if oldest != nil {
			w.retireLocked(oldest, "its place is needed by a process of another run config")
		}
	}
	w.seq++
	p = &warmProc{id: fmt.Sprintf("warm_%d_%d", os.Getpid(), w.seq), key: key, busy: true,
		started: make(chan struct{}), stopc: make(chan struct{}), exited: make(chan struct{})}
	w.procs = append(w.procs, p)
	w.live[p] = true
	w.mu.Unlock()
	if err := w.start(p, inv, workerID, stdout, stderr); err != nil {
		w.remove(p)
		return nil, true, err
	}
	return p, true, nil
}

// start starts p for inv and waits until it runs.
func (w *pool) start(p *warmProc, inv wire.RunInvocation, workerID string, stdout, stderr *os.File) error {
	cfg := w.r.cfg
	api, err := cfg.Runtime.AddWarm(p.group, inv.HostKey, workerID)
	if err != nil {
		return err
	}
	p.api = api
	fail := func(err error) error {
		api.Close()
		return err
	}
	p.dir = filepath.Join(cfg.Workdir, warmDirName, p.id)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fail(fmt.Errorf("create the warm process's directory: %w", err))
	}
	env := mergeEnv(cfg.BaseEnv, inv.RunConfig.Env, processEnv(inv), map[string]string{EnvRuntimeAPI: api.URL()})
	var sys *syscall.SysProcAttr
	if cfg.RunAs != nil {
		if err := handOver(cfg.Workdir, p.dir, p.dir, cfg.RunAs.Cred); err != nil {
			return fail(fmt.Errorf("hand the warm process's directory to %s: %w", cfg.RunAs.Name, err))
		}
		env = mergeEnv(env, map[string]string{"HOME": cfg.RunAs.Home, "USER": cfg.RunAs.Name, "LOGNAME": cfg.RunAs.Name})
		sys = &syscall.SysProcAttr{Credential: cfg.RunAs.Cred}
	}
	if len(inv.Argv) == 0 {
		return fail(errors.New("argv is empty"))
	}
	path, err := lookPathIn(inv.Argv[0], envValue(env, "PATH"))
	if err != nil {
		return fail(err)
	}
	if p.stdout, err = newOutputSwitch(stdout); err != nil {
		return fail(err)
	}
	if p.stderr, err = newOutputSwitch(stderr); err != nil {
		p.stdout.closeWriter()
		p.stdout.closeReader()
		return fail(err)
	}
	cmd := &exec.Cmd{Path: path, Args: inv.Argv, Dir: p.dir, Env: env, Stdout: p.stdout.w, Stderr: p.stderr.w, SysProcAttr: sys}
	go w.supervise(p, cmd)
	<-p.started
	if p.startErr != nil {
		<-p.exited
		return p.startErr
	}
	return nil
}

// supervise runs p's process group to its end, then cleans up after it.
func (w *pool) supervise(p *warmProc, cmd *exec.Cmd) {
	log := w.r.log.With("warm_process", p.id)
	res := w.r.runGroup(cmd, p.stopc, func(pid int) {
		p.pgidMu.Lock()
		p.pgid = pid
		p.pgidMu.Unlock()
		if err := w.r.cfg.Ledger.record(p.id, 0, pid); err != nil {
			log.Warn("cannot record the warm process's group; a daemon killed meanwhile would leave it running", "pid", pid, "error", err.Error())
		}
		log.Info("warm process started", "pid", pid)
		close(p.started)
	})
	// The parent's ends of the output pipes: the copies end at EOF, once
	// every member of the group is gone.
	p.stdout.closeWriter()
	p.stderr.closeWriter()
	if res.startErr != nil {
		p.startErr = fmt.Errorf("start the resident body: %w", res.startErr)
		close(p.started)
	} else {
		log.Info("warm process ended", "how", res.describe(), "terminated", res.terminated)
	}
	p.stdout.drain()
	p.stderr.drain()
	p.pgidMu.Lock()
	p.pgid = 0
	p.pgidMu.Unlock()
	if len(res.survivors) == 0 {
		_ = w.r.cfg.Ledger.forget(p.id, 0)
	} else {
		log.Error("process group still has live processes after SIGKILL: cleanup not confirmed", "pgid", res.pgid, "pids", res.survivors)
	}
	p.api.Close()
	_ = os.RemoveAll(p.dir)
	p.res = res
	w.remove(p)
	close(p.exited)
}

// release hands p back to the pool once its invocation is answered: it
// waits for the next one, unless the daemon drains.
func (w *pool) release(p *warmProc) {
	p.stdout.set(p.stdout.idle)
	p.stderr.set(p.stderr.idle)
	w.mu.Lock()
	defer w.mu.Unlock()
	p.busy = false
	p.idleSince = w.r.cfg.Clock.Now()
	if w.draining {
		w.retireLocked(p, "the daemon drains")
	}
}

// remove takes p out of the pool (it ended, or never started).
func (w *pool) remove(p *warmProc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.live, p)
	for i, q := range w.procs {
		if q == p {
			w.procs = append(w.procs[:i], w.procs[i+1:]...)
			return
		}
	}
}

// retireLocked tells p to end (w.mu held): its next GET next answers 410,
// it runs its on_shutdown hooks and exits; after warmExitWait it is
// terminated.
func (w *pool) retireLocked(p *warmProc, why string) {
	for i, q := range w.procs {
		if q == p {
			w.procs = append(w.procs[:i], w.procs[i+1:]...)
			break
		}
	}
	w.r.log.Info("stopping a warm process", "warm_process", p.id, "why", why)
	p.api.Shutdown()
	go func() {
		t := time.NewTimer(warmExitWait)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			w.r.log.Warn("a warm process told to end did not exit; terminating it", "warm_process", p.id, "waited", warmExitWait)
			p.stop()
		}
	}()
}

// expire retires the idle processes unused for keepAlive.
func (w *pool) expire(keepAlive time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range append([]*warmProc(nil), w.procs...) {
		if !p.busy && w.r.cfg.Clock.Since(p.idleSince) >= keepAlive {
			w.retireLocked(p, "idle for the warm keep-alive")
		}
	}
}

// DrainWarm tells the warm processes the daemon drains: the idle ones end
// now (running their on_shutdown hooks), the busy ones once their
// invocation is answered.
func (r *Runner) DrainWarm() {
	if r == nil || r.warm == nil {
		return
	}
	r.warm.mu.Lock()
	defer r.warm.mu.Unlock()
	r.warm.draining = true
	for _, p := range append([]*warmProc(nil), r.warm.procs...) {
		if !p.busy {
			r.warm.retireLocked(p, "the daemon drains")
		}
	}
}

// ExpireWarm stops the warm processes idle for WarmKeepAlive or longer;
// the daemon calls it every second or so.
func (r *Runner) ExpireWarm() {
	if r != nil && r.warm != nil {
		r.warm.expire(r.cfg.WarmKeepAlive)
	}
}

// CloseWarm ends every warm process, those already told to end included:
// each is told to end and given up to wait to exit, then terminated; it
// returns once all are gone (or, for a
// group that outlives SIGKILL, once its cleanup was given up on).
func (r *Runner) CloseWarm(wait time.Duration) {
	if r == nil || r.warm == nil {
		return
	}
	w := r.warm
	w.mu.Lock()
	w.draining = true
	var procs []*warmProc
	for p := range w.live {
		procs = append(procs, p)
	}
	w.procs = nil
	w.mu.Unlock()
	for _, p := range procs {
		p.api.Shutdown()
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for _, p := range procs {
		select {
		case <-p.exited:
			continue
		case <-deadline.C:
		}
		break
	}
	for _, p := range procs {
		p.stop()
	}
	for _, p := range procs {
		<-p.exited // runGroup's escalation is bounded: KillAfter, then killConfirmWait
	}
}

// WarmProcesses reports how many warm processes run now.
func (r *Runner) WarmProcesses() int {
	if r == nil || r.warm == nil {
		return 0
	}
	r.warm.mu.Lock()
	defer r.warm.mu.Unlock()
	return len(r.warm.procs)
}

// outputSwitch copies a warm process's output (one pipe) to where it
// belongs now: the log file of the invocation it serves, or its own log
// while idle. A switch waits until the pipe is empty, so what the process
// wrote before it answered (it flushes first) lands in that invocation's
// log, and nothing of it in the next one's.
type outputSwitch struct {
	r, w *os.File
	idle io.Writer // where output goes between invocations: the daemon's log of it is enough, so nowhere
	done chan struct{}

	mu  sync.Mutex
	dst io.Writer
}

func newOutputSwitch(dst io.Writer) (*outputSwitch, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("output pipe: %w", err)
	}
	o := &outputSwitch{r: pr, w: pw, idle: io.Discard, dst: dst, done: make(chan struct{})}
	go o.copy()
	return o, nil
}

// copy moves what the process writes to dst. It reads only while holding
// mu, so once set holds it and the pipe is empty, every byte written
// before has reached the old writer.
func (o *outputSwitch) copy() {
	defer close(o.done)
	rc, err := o.r.SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			n, rerr = syscall.Read(int(fd), buf)
			if errors.Is(rerr, syscall.EAGAIN) {
				return false
			}
			if n > 0 {
				_, _ = o.dst.Write(buf[:n])
			}
			return true
		})
		if err != nil || (rerr != nil && !errors.Is(rerr, syscall.EINTR)) || (rerr == nil && n == 0) {
			return
		}
	}
}

// set sends what the process writes from now on to dst, once what it
// wrote so far has been copied (bounded: a process that writes without
// pause loses the split's precision, never output).
func (o *outputSwitch) set(dst io.Writer) {
	for range 500 {
		o.mu.Lock()
		if o.pending() == 0 {
			o.dst = dst
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	o.mu.Lock()
	o.dst = dst
	o.mu.Unlock()
}

// pending reports the bytes waiting in the pipe (FIONREAD).
func (o *outputSwitch) pending() int {
	rc, err := o.r.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		var v int32
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&v))); e == 0 {
			n = int(v)
		}
	})
	return n
}

func (o *outputSwitch) closeWriter() { _ = o.w.Close() }
func (o *outputSwitch) closeReader() { _ = o.r.Close() }

// drain waits for the copy to reach EOF (bounded, as Exec's), then closes
// the read end.
func (o *outputSwitch) drain() {
	t := time.NewTimer(ExecDrainWait)
	defer t.Stop()
	select {
	case <-o.done:
	case <-t.C:
	}
	o.closeReader()
	<-o.done
}

// taskEnv is what an invocation sets on top of its warm process's
// environment: its env, the NYMPH_* variables, and the daemon's own.
func taskEnv(inv wire.RunInvocation, workerID, dir string, extra map[string]string) map[string]string {
	env := map[string]string{}
	for _, layer := range []map[string]string{inv.Env, nymphVars(inv, workerID, dir), extra} {
		for k, v := range layer {
			env[k] = v
		}
	}
	return env
}

// serveResident hands the run's invocation to a warm process and waits
// for its answer, its death, or a stop; it reports the outcome without
// tails. How it ends:
//   - the process answers: its result (or, for none, the result file as a
//     plain body's), or its error (body_error, bad_result);
//   - its on_host_setup hooks fail: host_setup_failed;
//   - it dies before taking the invocation, or never asks for it within
//     the timeout (WarmStartTimeout without one): start_failed;
//   - it dies while the body runs: abandoned (process_lost), so the
//     invocation is handed out again as a lost worker's;
//   - a stop (cancel, timeout, the daemon's kill) terminates the process:
//     the outcome is the stop's, as for a plain body.
//
// An idle process found dead before it took the invocation (it died
// waiting) costs nothing: the invocation goes to a new one.
func (r *Run) serveResident(workerID, dir, bodyDir string, stdout, stderr *os.File, timeout time.Duration) Outcome {
	if r.runner.warm == nil {
		r.seal()
		return failedOutcome(ErrorTypeStartFailed, "run_config.resident needs nymph's runtime API, which this daemon does not serve (--lifecycle-addr off)", nil)
	}
	for {
		o, diedIdle := r.serveOn(workerID, dir, bodyDir, stdout, stderr, timeout)
		if !diedIdle {
			return o
		}
		r.log.Warn("the idle warm process given this invocation had died; starting a new one")
	}
}

// serveOn serves the run on one warm process (serveResident). diedIdle
// reports an idle process that died before it took the invocation: the
// run is not sealed, and may try another.
func (r *Run) serveOn(workerID, dir, bodyDir string, stdout, stderr *os.File, timeout time.Duration) (o Outcome, diedIdle bool) {
	w := r.runner.warm
	p, fresh, err := w.acquire(r.inv, workerID, stdout, stderr)
	if err != nil {
		r.seal()
		r.log.Error("warm process could not start", "error", err.Error())
		return failedOutcome(ErrorTypeStartFailed, err.Error(), nil), false
	}
	r.setGroup(p.group())
	defer r.setGroup(0)
	t := lifecycle.Task{InvocationID: r.inv.InvocationID, Attempt: r.inv.Attempt, WorkerID: workerID, HostKey: r.inv.HostKey,
		Input: r.inv.Input, Workdir: bodyDir, Env: taskEnv(r.inv, workerID, dir, r.extraEnv)}
	if timeout > 0 {
		t.Deadline = r.begin.Add(timeout)
	}
	offer, err := p.api.Offer(t)
	if err != nil {
		p.stop()
		r.seal()
		return failedOutcome(ErrorTypeInternal, err.Error(), nil), false
	}
	var startBy <-chan time.Time
	if fresh && timeout <= 0 {
		st := time.NewTimer(WarmStartTimeout)
		defer st.Stop()
		startBy = st.C
	}
	taken, takenc := false, offer.Taken()
	answered := func(rep lifecycle.Reply) Outcome {
		r.seal()
		w.release(p)
		return r.residentOutcome(dir, rep)
	}
	hostSetupFailed := func(rep lifecycle.Reply) Outcome {
		r.seal()
		p.api.Withdraw()
		t := time.NewTimer(r.runner.cfg.KillAfter + time.Second)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.stop()
			<-p.exited
		}
		return failedOutcome(ErrorTypeHostSetupFailed, "on_host_setup failed: "+rep.Message, nil)
	}
	neverAsked := func(how string) Outcome {
		return failedOutcome(ErrorTypeStartFailed, fmt.Sprintf("the resident body %s before it asked for an invocation (GET $%s/next): "+
			"a resident body serves nymph's runtime API (Python: dls.serve())", how, EnvRuntimeAPI), nil)
	}
	for {
		select {
		case <-takenc:
			takenc, taken = nil, true
			r.mu.Lock()
			r.pid = p.group()
			r.mu.Unlock()
			r.log.Info("body started on a warm process", "warm_process", p.id, "pid", r.pid, "fresh", fresh)
			r.markStarted()
		case rep := <-offer.Reply():
			return answered(rep), false
		case rep := <-p.api.InitFailed():
			return hostSetupFailed(rep), false
		case <-p.exited:
			select {
			case rep := <-offer.Reply():
				return answered(rep), false
			case rep := <-p.api.InitFailed():
				return hostSetupFailed(rep), false // it reported, then exited: the report says why
			default:
			}
			if !taken && !fresh {
				return Outcome{}, true // it died idle: not this invocation's doing
			}
			r.seal()
			code := p.res.exitCode()
			if !taken {
				return neverAsked(p.res.describe()), false
			}
			r.log.Warn("the warm process died while its body ran; handing the invocation back as a lost worker's", "warm_process", p.id, "how", p.res.describe())
			return Outcome{State: wire.StateFailed, Abandoned: true, ExitCode: &code,
				Error: &wire.ErrorInfo{Type: ErrorTypeProcessLost, Message: "the warm process died while the body ran (" + p.res.describe() + "); handed out again"}}, false
		case <-startBy:
			r.seal()
			p.api.Withdraw()
			p.stop()
			<-p.exited
			return neverAsked("did not ask within " + WarmStartTimeout.String() + " of its start (the on_host_setup hooks included)"), false
		case <-r.stopc:
			select {
			case rep := <-offer.Reply():
				return answered(rep), false // answered before the stop reached it: that outcome stands
			default:
			}
			reason := r.seal()
			p.api.Withdraw()
			p.stop()
			<-p.exited
			r.noteGroup("warm process", p.res)
			if reason == stopTimeout && !taken {
				return neverAsked(fmt.Sprintf("timed out after %s (timeout_s %d)", timeout, r.inv.TimeoutS)), false
			}
			where := ""
			if !taken {
				where = " before the body started"
			}
			return r.stoppedOutcome(reason, where, p.res, timeout), false
		}
	}
}

// residentOutcome is the outcome a warm process's answer gives.
func (r *Run) residentOutcome(dir string, rep lifecycle.Reply) Outcome {
	if rep.Failed() {
		return failedOutcome(rep.ErrorType, rep.Message, nil)
	}
	o := Outcome{State: wire.StateSucceeded, ResultBlob: rep.Result}
	if o.ResultBlob != nil {
		return o
	}
	// No result posted: a result file the body wrote stands, as a plain
	// body's does.
	blob, err := readResultFile(filepath.Join(dir, ResultFileName))
	if err != nil {
		o.State = wire.StateFailed
		o.Error = &wire.ErrorInfo{Type: ErrorTypeBadResult, Message: clipMessage(err.Error())}
		return o
	}
	o.ResultBlob = blob
	return o
}
