package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/cadence"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// Size limits. Each is documented in docs/limits.md; a request over one gets
// a 400 (or 413 for the body) and changes nothing.
const (
	MaxBodyBytes       = 256 << 10 // whole request body
	MaxArgvBytes       = 64 << 10  // sum of argv element lengths
	MaxArgvItems       = 4096
	MaxEnvEntries      = 100
	MaxEnvBytes        = 32 << 10 // sum of key and value lengths
	MaxQueueLen        = 64
	MaxResultBlobBytes = 128 << 10
	// MaxInputBytes bounds an invocation's input in its compact JSON
	// form. A single submit's whole body is bounded by MaxBodyBytes too,
	// so its input must fit in what the rest of the request leaves.
	MaxInputBytes = 256 << 10
	// MaxSpecBytes bounds what a submit's input, argv, env and run_config
	// take together (an input at its limit leaves 4 KiB for the rest):
	// with a result (MaxResultBlobBytes), the output tails and the attempt
	// history, the invocation's row stays under DynamoDB's 400 KB item
	// limit, which the emulators do not enforce.
	MaxSpecBytes       = MaxInputBytes + 4<<10
	MaxTailBytes       = 4 << 10
	MaxSetupCommands   = 64 // host_setup, run_setup
	MaxExitCodes       = 32 // retry.exit_codes, run_config.requeue_exit_codes
	MaxSetupBytes      = 16 << 10
	MaxLabelLen        = 256
	MaxTags            = 50
	MaxTagBytes        = 256 // each key and value
	MaxLanes           = 16
	MaxIDLen           = 256 // machine_id, boot_id, idempotency_key, host_key
	MaxInflightIDs     = 1024
	MaxSetupResults    = 64
	MaxTimeoutS        = 7 * 24 * 3600
	MaxAttemptsLimit   = 20
	DefaultMaxAttempts = 3
	// MaxAttemptNumber bounds an attempt number on the wire: attempts its
	// worker never received and reruns take one invocation past
	// max_attempts, up to domain.MaxHandOuts.
	MaxAttemptNumber = domain.MaxHandOuts
	// MaxRetryBackoffS is the longest first wait a retry policy may ask
	// for: the domain never waits longer before a retry.
	MaxRetryBackoffS  = int(domain.MaxRetryBackoff / time.Second)
	MaxConcurrency    = 1024
	MaxMessageBytes   = 4 << 10 // error message in an ack
	MaxSetupTextBytes = 4 << 10 // a setup result's command: a --host-setup command's shell text
	MaxPollTimeoutS   = int(cadence.MaxHold / time.Second)
)

// ValidQueue reports whether q is a well-formed queue name
// (domain.ValidQueue).
func ValidQueue(q string) bool { return domain.ValidQueue(q) }

// ValidWorkdir reports whether a run config's workdir names a directory
// inside the run directory: "" (the run directory itself), or a relative
// path that never climbs out of it ("..") and holds no NUL. The daemon
// refuses any other, so submit does too.
func ValidWorkdir(dir string) bool {
	return dir == "" || (!filepath.IsAbs(dir) && filepath.IsLocal(dir) && !strings.ContainsRune(dir, 0))
}

// Validator is implemented by every request body.
type Validator interface {
	Validate() error
}

// Decode reads one JSON value from r into v and validates it. The body may
// be at most MaxBodyBytes (else CodeTooLarge); it must be valid UTF-8 JSON with
// no trailing data and no key repeated within an object (compared
// case-insensitively, as field names are matched); unknown fields are
// ignored.
func Decode(r io.Reader, v Validator) error {
	return DecodeLimit(r, v, MaxBodyBytes)
}

// DecodeLimit is Decode for a body of at most limit bytes (a run's
// submit: MaxRunBodyBytes).
func DecodeLimit(r io.Reader, v Validator, limit int) error {
	body, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return Errorf(CodeInvalid, "read body: %v", err)
	}
	if len(body) > limit {
		return Errorf(CodeTooLarge, "body is over %d bytes", limit)
	}
	if !utf8.Valid(body) {
		return Errorf(CodeInvalid, "body is not valid UTF-8")
	}
	if k := duplicateKey(body, reflect.TypeOf(v)); k != "" {
		return Errorf(CodeInvalid, "body repeats the key %q (keys are matched case-insensitively; send each field once)", clip(k))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeInvalid, "body is not the expected JSON: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(CodeInvalid, "body has data after the JSON value")
	}
	if s, ok := v.(sentChecker); ok {
		if err := s.checkSent(body); err != nil {
			return err
		}
	}
	return v.Validate()
}

// sentChecker is a request with fields whose zero value stands for "the
// default" only when the field is left out: Go's decoder cannot tell a
// zero sent from an absent field, so checkSent reads the body again and
// refuses a zero a client sent.
type sentChecker interface {
	checkSent(body []byte) error
}

func describeJSONError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field != "" {
			return fmt.Sprintf("field %q must be a %s", typeErr.Field, typeErr.Type)
		}
		return fmt.Sprintf("expected a %s", typeErr.Type)
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("syntax error at byte %d", syntaxErr.Offset)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "empty or truncated body"
	}
	return err.Error()
}

func invalid(format string, args ...any) error { return Errorf(CodeInvalid, format, args...) }

func checkID(field, prefix, id string) error {
	if id == "" {
		return invalid("%s is required", field)
	}
	if !ids.Valid(prefix, id) {
		return invalid("%s must be %s_ followed by a ULID, got %q", field, prefix, clip(id))
	}
	return nil
}

func checkText(field, s string, max int, required bool) error {
	if s == "" && required {
		return invalid("%s is required", field)
	}
	if len(s) > max {
		return invalid("%s is %d bytes; the limit is %d", field, len(s), max)
	}
	return nil
}

func checkQueue(q string) error {
	if q == "" {
		return invalid("queue is required")
	}
	if !ValidQueue(q) {
		return invalid("queue must be 1-%d characters of A-Z a-z 0-9 _ . -, starting with a letter or digit; got %q", MaxQueueLen, clip(q))
	}
	return nil
}

func checkArgv(field string, argv []string, required bool) error {
	if len(argv) == 0 {
		if required {
			return invalid("%s must hold at least one element", field)
		}
		return nil
	}
	if len(argv) > MaxArgvItems {
		return invalid("%s has %d elements; the limit is %d", field, len(argv), MaxArgvItems)
	}
	total := 0
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("%s[%d] holds a NUL byte, which no program can be passed", field, i)
		}
		total += len(a)
	}
	if total > MaxArgvBytes {
		return invalid("%s is %d bytes in all; the limit is %d", field, total, MaxArgvBytes)
	}
	if argv[0] == "" {
		return invalid("%s[0] (the program) must not be empty", field)
	}
	return nil
}

func checkEnv(field string, env map[string]string) error {
	if len(env) > MaxEnvEntries {
		return invalid("%s has %d entries; the limit is %d", field, len(env), MaxEnvEntries)
	}
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("%s key %q must be non-empty and hold no '=' or NUL", field, clip(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return invalid("%s value of %q holds a NUL byte", field, clip(k))
		}
		total += len(k) + len(v)
	}
	if total > MaxEnvBytes {
		return invalid("%s is %d bytes in all; the limit is %d", field, total, MaxEnvBytes)
	}
	return nil
}

func checkCommands(field string, cmds []string) error {
	if len(cmds) > MaxSetupCommands {
		return invalid("%s has %d commands; the limit is %d", field, len(cmds), MaxSetupCommands)
	}
	total := 0
	for i, c := range cmds {
		if c == "" {
			return invalid("%s[%d] is empty", field, i)
		}
		if strings.IndexByte(c, 0) >= 0 {
			return invalid("%s[%d] holds a NUL byte", field, i)
		}
		total += len(c)
	}
	if total > MaxSetupBytes {
		return invalid("%s is %d bytes in all; the limit is %d", field, total, MaxSetupBytes)
	}
	return nil
}

func checkOneOf(field, v string, allowed ...string) error {
	if !slices.Contains(allowed, v) {
		return invalid("%s must be one of %v, got %q", field, allowed, clip(v))
	}
	return nil
}

func checkCapabilities(field string, c *Capabilities) error {
	if c == nil {
		return nil
	}
	if c.MaxConcurrency != nil && (*c.MaxConcurrency < 1 || *c.MaxConcurrency > MaxConcurrency) {
		return invalid("%s.max_concurrency must be 1-%d", field, MaxConcurrency)
	}
	if c.CurrentInvocations != nil && (*c.CurrentInvocations < 0 || *c.CurrentInvocations > MaxConcurrency) {
		return invalid("%s.current_invocations must be 0-%d", field, MaxConcurrency)
	}
	return nil
}

// clip shortens a value quoted back in an error message.
func clip(s string) string { return ClipString(s, 64) }

// ClipString shortens s to at most n bytes on a rune boundary, for quoting
// caller-supplied strings in messages.
func ClipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Validate checks a hello.
func (r *HelloRequest) Validate() error {
	if err := checkText("machine_id", r.MachineID, MaxIDLen, true); err != nil {
		return err
	}
	if err := checkText("boot_id", r.BootID, MaxIDLen, true); err != nil {
		return err
	}
	if err := checkText("label", r.Label, MaxLabelLen, false); err != nil {
		return err
	}
	if err := checkLabels("tags", r.Tags); err != nil {
		return err
	}
	if len(r.Lanes) > MaxLanes {
		return invalid("lanes has %d entries; the limit is %d", len(r.Lanes), MaxLanes)
	}
	for _, l := range r.Lanes {
		if err := checkQueue(l); err != nil {
			return invalid("lanes: %s", err.(*Error).Message)
		}
	}
	if err := checkLabels("versions", r.Versions); err != nil {
		return err
	}
	if err := checkCapabilities("capabilities", &r.Capabilities); err != nil {
		return err
	}
	return checkHostKey(r.HostKey)
}

// checkLabels checks a small string map (tags, versions): at most MaxTags
// entries, keys of 1 to MaxTagBytes bytes (DynamoDB refuses an empty map
// key), values of at most MaxTagBytes.
func checkLabels(field string, m map[string]string) error {
	if len(m) > MaxTags {
		return invalid("%s has %d entries; the limit is %d", field, len(m), MaxTags)
	}
	for k, v := range m {
		if k == "" || len(k) > MaxTagBytes || len(v) > MaxTagBytes {
			return invalid("%s %q: keys must be 1-%d bytes and values at most %d", field, clip(k), MaxTagBytes, MaxTagBytes)
		}
	}
	return nil
}

func checkHostKey(k string) error { return checkKeyField("host_key", k) }

// Validate checks a release: a well-formed queue, and a host key or none.
func (r *ReleaseHoldRequest) Validate() error {
	if !ValidQueue(r.Queue) {
		return invalid("queue %q is not a queue name", clip(r.Queue))
	}
	return checkHostKey(r.HostKey)
}

// checkKeyField checks field k: empty, or a host key (hk1_ and 64
// lower-case hex digits).
func checkKeyField(field, k string) error {
	if k == "" {
		return nil
	}
	if len(k) != 4+64 || k[:4] != "hk1_" {
		return invalid("%s must be hk1_ followed by 64 hex digits, got %q", field, clip(k))
	}
	for _, c := range k[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return invalid("%s must be hk1_ followed by 64 lower-case hex digits, got %q", field, clip(k))
		}
	}
	return nil
}

// Validate checks a poll.
func (r *PollRequest) Validate() error {
	if err := checkID("worker_id", ids.Worker, r.WorkerID); err != nil {
		return err
	}
	if r.Queue != "" {
		if err := checkQueue(r.Queue); err != nil {
			return err
		}
	}
	if math.IsNaN(r.TimeoutS) || r.TimeoutS < 0 || r.TimeoutS > 3600 {
		return invalid("timeout_s must be between 0 and 3600 (waits are capped at %d)", MaxPollTimeoutS)
	}
	if len(r.Invocations) > MaxInflightIDs {
		return invalid("invocations has %d ids; the limit is %d", len(r.Invocations), MaxInflightIDs)
	}
	for _, id := range r.Invocations {
		if err := checkID("invocations[]", ids.Invocation, id); err != nil {
			return err
		}
	}
	if err := checkPhase(r.Phase); err != nil {
		return err
	}
	if err := checkHostKey(r.HostKey); err != nil {
		return err
	}
	if err := checkKeyField("adopt_failed", r.AdoptFailed); err != nil {
		return err
	}
	if err := checkCapabilities("updated_capabilities", r.UpdatedCapabilities); err != nil {
		return err
	}
	if len(r.SetupResults) > MaxSetupResults {
		return invalid("setup_results has %d entries; the limit is %d", len(r.SetupResults), MaxSetupResults)
	}
	for _, s := range r.SetupResults {
		// A --host-setup result names its shell text instead of a command id:
		// the control plane never queued it.
		switch {
		case s.CommandID == "" && s.Command == "":
			return invalid("setup_results[] needs a command_id (a control-plane command) or a command (a --host-setup command)")
		case s.CommandID != "":
			if err := checkID("setup_results[].command_id", ids.Command, s.CommandID); err != nil {
				return err
			}
		}
		if err := checkText("setup_results[].command", s.Command, MaxSetupTextBytes, false); err != nil {
			return err
		}
		if err := checkOneOf("setup_results[].status", s.Status, SetupSucceeded, SetupFailed); err != nil {
			return err
		}
		if err := checkText("setup_results[].output_tail", s.OutputTail, MaxTailBytes, false); err != nil {
			return err
		}
		if s.DurationMS < 0 {
			return invalid("setup_results[].duration_ms must not be negative")
		}
	}
	return nil
}

// Validate checks an ack.
func (r *AckRequest) Validate() error {
	if err := checkID("worker_id", ids.Worker, r.WorkerID); err != nil {
		return err
	}
	if err := checkID("invocation_id", ids.Invocation, r.InvocationID); err != nil {
		return err
	}
	if r.Attempt < 1 || r.Attempt > MaxAttemptNumber {
		return invalid("attempt must be 1-%d", MaxAttemptNumber)
	}
	if err := checkOneOf("state", r.State, StateSucceeded, StateFailed, StateCancelled, AckRequeued); err != nil {
		return err
	}
	if len(r.ResultBlob) > MaxResultBlobBytes {
		return invalid("result_blob is %d bytes; the limit is %d", len(r.ResultBlob), MaxResultBlobBytes)
	}
	if r.Error != nil {
		if err := checkText("error.type", r.Error.Type, 64, true); err != nil {
			return err
		}
		if err := checkText("error.message", r.Error.Message, MaxMessageBytes, false); err != nil {
			return err
		}
	}
	if err := checkText("stdout_tail", r.StdoutTail, MaxTailBytes, false); err != nil {
		return err
	}
	if err := checkText("stderr_tail", r.StderrTail, MaxTailBytes, false); err != nil {
		return err
	}
	return checkPhase(r.Phase)
}

// checkPhase checks a daemon's phase as a poll or an ack reports it: one
// it may send, or none ("": a daemon that sends none).
func checkPhase(phase string) error {
	if phase == "" {
		return nil
	}
	return checkOneOf("phase", phase, PhaseSetup, PhaseReady, PhaseDraining, PhaseTerminating)
}

// MaxLogBytesPerRequest bounds the output one POST /v1/daemon/logs carries
// (base64 makes it 4/3 larger on the wire, under MaxBodyBytes).
const MaxLogBytesPerRequest = 4 * domain.LogChunkBytes

// Validate checks a logs request: known attempts, chunks in bounds, no
// more than MaxLogBytesPerRequest of output in all.
func (r *LogsRequest) Validate() error {
	if err := checkID("worker_id", ids.Worker, r.WorkerID); err != nil {
		return err
	}
	if len(r.Logs) == 0 || len(r.Logs) > 64 {
		return invalid("logs must hold 1-64 attempts; got %d", len(r.Logs))
	}
	total := 0
	for i, b := range r.Logs {
		if err := checkID(fmt.Sprintf("logs[%d].invocation_id", i), ids.Invocation, b.InvocationID); err != nil {
			return err
		}
		if b.Attempt < 1 || b.Attempt > MaxAttemptNumber {
			return invalid("logs[%d].attempt must be 1-%d", i, MaxAttemptNumber)
		}
		if len(b.Chunks) == 0 {
			return invalid("logs[%d].chunks is empty", i)
		}
		for j, c := range b.Chunks {
			where := fmt.Sprintf("logs[%d].chunks[%d]", i, j)
			if c.Seq < 0 || c.Seq >= domain.MaxLogChunks {
				return invalid("%s.seq must be 0-%d", where, domain.MaxLogChunks-1)
			}
			if err := checkOneOf(where+".stream", c.Stream, domain.LogStdout, domain.LogStderr); err != nil {
				return err
			}
			if len(c.Data) > domain.LogChunkBytes {
				return invalid("%s.data is %d bytes; the limit is %d", where, len(c.Data), domain.LogChunkBytes)
			}
			if c.Dropped < 0 {
				return invalid("%s.dropped is negative", where)
			}
			total += len(c.Data)
		}
	}
	if total > MaxLogBytesPerRequest {
		return invalid("logs carry %d bytes of output; the limit per request is %d", total, MaxLogBytesPerRequest)
	}
	return nil
}

// Validate checks a bye.
func (r *ByeRequest) Validate() error {
	if err := checkID("worker_id", ids.Worker, r.WorkerID); err != nil {
		return err
	}
	if err := checkOneOf("reason", r.Reason, ByeIdle, ByeSignal, ByeDrain, ByeHelloFailed, ByeSpotInterruption); err != nil {
		return err
	}
	if r.InflightAbandoned < 0 || r.InflightAbandoned > MaxConcurrency {
		return invalid("inflight_abandoned must be 0-%d", MaxConcurrency)
	}
	return nil
}

// Validate checks a submit and fills defaults.
func (r *SubmitRequest) Validate() error {
	if err := checkQueue(r.Queue); err != nil {
		return err
	}
	if err := checkArgv("argv", r.Argv, true); err != nil {
		return err
	}
	if err := checkEnv("env", r.Env); err != nil {
		return err
	}
	if err := checkEnv("run_config.env", r.RunConfig.Env); err != nil {
		return err
	}
	if err := checkCommands("run_config.host_setup", r.RunConfig.HostSetup); err != nil {
		return err
	}
	if err := checkCommands("run_config.run_setup", r.RunConfig.RunSetup); err != nil {
		return err
	}
	if err := checkText("run_config.workdir", r.RunConfig.Workdir, 1024, false); err != nil {
		return err
	}
	if !ValidWorkdir(r.RunConfig.Workdir) {
		return invalid("run_config.workdir must be a path relative to the run directory, inside it (no leading /, no ..)")
	}
	if r.RunConfig.DrainSignal != "" && !slices.Contains(DrainSignals, r.RunConfig.DrainSignal) {
		return invalid("run_config.drain_signal %q is not one of %s", r.RunConfig.DrainSignal, strings.Join(DrainSignals, ", "))
	}
	if err := checkExitCodes("run_config.requeue_exit_codes", r.RunConfig.RequeueExitCodes); err != nil {
		return err
	}
	if r.TimeoutS < 0 || r.TimeoutS > MaxTimeoutS {
		return invalid("timeout_s must be 0 (none) to %d", MaxTimeoutS)
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if err := CheckMaxAttempts(r.MaxAttempts); err != nil {
		return err
	}
	if p := r.Retry; p != nil {
		if len(p.ExitCodes) == 0 && !p.Timeout {
			return invalid("retry must name exit_codes or timeout (absent: no retry of a failing body)")
		}
		if err := checkExitCodes("retry.exit_codes", p.ExitCodes); err != nil {
			return err
		}
		if p.BackoffS == 0 {
			p.BackoffS = DefaultRetryBackoffS
		}
		if err := CheckRetryBackoffS(p.BackoffS); err != nil {
			return err
		}
	}
	if err := checkInput("input", &r.Input); err != nil {
		return err
	}
	if n := r.rowBytes(); n > MaxSpecBytes {
		return invalid("input, argv, env and run_config are %d bytes together; the limit is %d (an invocation's row, with its result and output tails, must stay under DynamoDB's 400 KB item limit)", n, MaxSpecBytes)
	}
	return checkText("idempotency_key", r.IdempotencyKey, MaxIDLen, false)
}

// rowBytes is about what r's fields take of its invocation's row.
func (r *SubmitRequest) rowBytes() int {
	n := len(r.Input) + len(r.RunConfig.Workdir)
	for _, list := range [][]string{r.Argv, r.RunConfig.HostSetup, r.RunConfig.RunSetup} {
		for _, a := range list {
			n += len(a)
		}
	}
	for _, env := range []map[string]string{r.Env, r.RunConfig.Env} {
		for k, v := range env {
			n += len(k) + len(v)
		}
	}
	return n
}

// checkInput checks an invocation's input: a JSON value of at most
// MaxInputBytes once compacted. It leaves *in compact (JSON null: none),
// so what is stored and handed to the body is what was checked.
func checkInput(field string, in *json.RawMessage) error {
	if len(*in) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, *in); err != nil {
		return invalid("%s is not valid JSON: %v", field, err)
	}
	if buf.Len() > MaxInputBytes {
		return invalid("%s is %d bytes of compact JSON; the limit is %d", field, buf.Len(), MaxInputBytes)
	}
	if buf.String() == "null" {
		*in = nil
		return nil
	}
	*in = json.RawMessage(buf.Bytes())
	return nil
}

// checkSent refuses a max_attempts or retry.backoff_s of 0 sent
// explicitly: left out, each takes its default, but a client that sends 0
// asked for something else, and running it as the default would change
// its request without a word.
func (r *SubmitRequest) checkSent(body []byte) error {
	var sent struct {
		MaxAttempts *int `json:"max_attempts"`
		Retry       *struct {
			BackoffS *int `json:"backoff_s"`
		} `json:"retry"`
	}
	if err := json.Unmarshal(body, &sent); err != nil {
		return Errorf(CodeInvalid, "body is not the expected JSON: %s", describeJSONError(err))
	}
	if sent.MaxAttempts != nil && *sent.MaxAttempts == 0 {
		return CheckMaxAttempts(0)
	}
	if sent.Retry != nil && sent.Retry.BackoffS != nil && *sent.Retry.BackoffS == 0 {
		return CheckRetryBackoffS(0)
	}
	return nil
}

// CheckMaxAttempts reports why n is not a max_attempts a submit may ask
// for (nil when it is one): 1 to MaxAttemptsLimit; left out, it is
// DefaultMaxAttempts.
func CheckMaxAttempts(n int) error {
	if n < 1 || n > MaxAttemptsLimit {
		return invalid("max_attempts must be 1-%d, got %d (leave it out for the default, %d)", MaxAttemptsLimit, n, DefaultMaxAttempts)
	}
	return nil
}

// CheckRetryBackoffS reports why n is not a retry.backoff_s a submit may
// ask for (nil when it is one): 1 to MaxRetryBackoffS, the longest wait
// before a retry; left out, it is DefaultRetryBackoffS.
func CheckRetryBackoffS(n int) error {
	if n < 1 || n > MaxRetryBackoffS {
		return invalid("retry.backoff_s must be 1-%d seconds (%s, the longest wait before a retry), got %d (leave it out for the default, %d)",
			MaxRetryBackoffS, domain.MaxRetryBackoff, n, DefaultRetryBackoffS)
	}
	return nil
}

// checkExitCodes checks a list of exit statuses of a failure: at most
// MaxExitCodes, each 1-255 (128+n for signal n).
func checkExitCodes(field string, codes []int) error {
	if len(codes) > MaxExitCodes {
		return invalid("%s holds %d codes; at most %d", field, len(codes), MaxExitCodes)
	}
	for _, c := range codes {
		if c < 1 || c > 255 {
			return invalid("%s: %d is not an exit status of a failure (1-255)", field, c)
		}
	}
	return nil
}

// Validate checks a setup command.
func (r *SetupRequest) Validate() error {
	return checkArgv("argv", r.Argv, true)
}
