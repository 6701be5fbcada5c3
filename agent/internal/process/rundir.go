package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// runDirs reports the run directory of inv under root and the directory the
// body works in. The invocation id must be one plain path element and
// run_config.workdir a local relative path: neither may reach outside.
func runDirs(root string, inv wire.RunInvocation) (dir, bodyDir string, err error) {
	id := inv.InvocationID
	if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`+"\x00") {
		return "", "", fmt.Errorf("invocation id %q is not a plain directory name", ClipString(id, 200))
	}
	dir = filepath.Join(root, id, strconv.Itoa(inv.Attempt))
	sub := inv.RunConfig.Workdir
	if sub == "" {
		return dir, dir, nil
	}
	if !wire.ValidWorkdir(sub) {
		return "", "", fmt.Errorf("run_config.workdir %q must be a relative path inside the run directory", ClipString(sub, 200))
	}
	return dir, filepath.Join(dir, sub), nil
}

// createLog creates a run's log file. O_NOFOLLOW: a run directory that
// already existed (a restarted daemon re-running an attempt) may hold a
// symlink a body planted, and the daemon must not truncate its target.
func createLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	return f, nil
}

// bodyEnv is the environment of a run's processes: base, then the run
// config's env, then the invocation's, then the NYMPH_* variables, which
// nothing overrides.
// NYMPH_INPUT_FILE is set only for an invocation that carries input.
func bodyEnv(base []string, inv wire.RunInvocation, workerID, dir string) []string {
	return mergeEnv(base, inv.RunConfig.Env, inv.Env, nymphVars(inv, workerID, dir))
}

// nymphVars are the NYMPH_* variables of a run whose directory is dir.
func nymphVars(inv wire.RunInvocation, workerID, dir string) map[string]string {
	nymph := map[string]string{
		"NYMPH_INVOCATION_ID": inv.InvocationID,
		"NYMPH_ATTEMPT":       strconv.Itoa(inv.Attempt),
		"NYMPH_WORKER_ID":     workerID,
		"NYMPH_WORKDIR":       dir,
		"NYMPH_RESULT_FILE":   filepath.Join(dir, ResultFileName),
	}
	if len(inv.Input) > 0 {
		nymph["NYMPH_INPUT_FILE"] = filepath.Join(dir, InputFileName)
	}
	return nymph
}

// writeInput writes an invocation's input to path, made afresh: a file a
// body left there (a restarted daemon re-running an attempt), even a
// symlink, is removed, never written through. With --run-as the file is
// the account's, so its body can read it.
func writeInput(path string, input []byte, cred *syscall.Credential) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove a stale %s: %w", filepath.Base(path), err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	_, err = f.Write(input)
	if err == nil && cred != nil {
		err = f.Chown(int(cred.Uid), int(cred.Gid))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// mergeEnv layers maps over base ("K=V" entries; ones without "=" are
// dropped), later winning, and reports the result sorted by key.
func mergeEnv(base []string, layers ...map[string]string) []string {
	m := make(map[string]string, len(base))
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	for _, layer := range layers {
		for k, v := range layer {
			m[k] = v
		}
	}
	keys := slices.Sorted(maps.Keys(m))
	env := make([]string, len(keys))
	for i, k := range keys {
		env[i] = k + "=" + m[k]
	}
	return env
}

// envValue reports the value of key in env ("K=V" entries; the last wins).
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// readResultFile reads a result file and reports the blob an ack carries (see
// resultBlob). A missing file is (nil, nil); a file that is not a regular
// file, over wire.MaxResultBlobBytes as read, not valid UTF-8, or not a blob
// resultBlob accepts is an error saying why.
func readResultFile(path string) (json.RawMessage, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("result file is not a regular file (%s)", fi.Mode().Type())
	}
	if fi.Size() > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is %d bytes; the limit is %d", fi.Size(), wire.MaxResultBlobBytes)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, wire.MaxResultBlobBytes+1))
	if err != nil {
		return nil, fmt.Errorf("result file: %w", err)
	}
	if len(data) > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is over the limit of %d bytes", wire.MaxResultBlobBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("result file is not valid UTF-8")
	}
	return resultBlob(data)
}

// resultBlob reports the blob an ack carries for the contents of a result
// file. A file that is one JSON value (whitespace around it allowed) is that
// value. Any other file must be JSON lines, the records a body appends as it
// goes: every line is one JSON value or blank (JSON whitespace only; a CR
// before the newline is whitespace, so CRLF files pass), and the values, in
// order, become one JSON array. Two values on one line are refused, because a
// line is one record. A file with no value at all (empty, or whitespace) is
// refused as not valid JSON.
//
// The blob is in its canonical form, the one json.Marshal sends: compact and
// HTML-escaped. Its size is checked against wire.MaxResultBlobBytes in that
// form, after any conversion to an array, so the control plane's limit holds
// for exactly what is sent.
func resultBlob(data []byte) (json.RawMessage, error) {
	var compact bytes.Buffer
	if json.Valid(data) {
		if err := json.Compact(&compact, data); err != nil {
			return nil, fmt.Errorf("result file is not valid JSON: %w", err)
		}
	} else if err := compactJSONLines(&compact, data); err != nil {
		return nil, err
	}
	var escaped bytes.Buffer
	json.HTMLEscape(&escaped, compact.Bytes())
	if escaped.Len() > wire.MaxResultBlobBytes {
		return nil, fmt.Errorf("result file is %d bytes once compacted and escaped; the limit is %d", escaped.Len(), wire.MaxResultBlobBytes)
	}
	return json.RawMessage(escaped.Bytes()), nil
}

// compactJSONLines writes the values of data's non-blank lines to dst as one
// compact JSON array, or reports the first line (counted from 1) that is not
// one JSON value.
func compactJSONLines(dst *bytes.Buffer, data []byte) error {
	dst.WriteByte('[')
	lineNo, values := 0, 0
	for line := range bytes.Lines(data) {
		lineNo++
		if len(bytes.Trim(line, " \t\r\n")) == 0 {
			continue
		}
		if values > 0 {
			dst.WriteByte(',')
		}
		if err := json.Compact(dst, line); err != nil {
			return fmt.Errorf("result file is not valid JSON, as one value or as JSON lines: line %d is not a JSON value: %w", lineNo, err)
		}
		values++
	}
	if values == 0 {
		return errors.New("result file is not valid JSON: it holds no value")
	}
	dst.WriteByte(']')
	return nil
}

// fileTail reports the last limit bytes of f as tail text.
func fileTail(f *os.File, limit int) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", filepath.Base(f.Name()), err)
	}
	off := max(fi.Size()-int64(limit), 0)
	buf := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read %s: %w", filepath.Base(f.Name()), err)
	}
	return tailText(buf[:n], off > 0, limit), nil
}

// tailText turns the last bytes of a stream into valid UTF-8 of at most limit
// bytes. cut says the stream went on before b: a rune split by the cut is
// dropped rather than shown as garbage. Invalid bytes become U+FFFD; if that
// grows the text past limit, whole runes are dropped from the front.
func tailText(b []byte, cut bool, limit int) string {
	if cut {
		for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if len(s) > limit {
		s = s[len(s)-limit:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	return s
}

// tailBuffer is an io.Writer that keeps the last max bytes written.
type tailBuffer struct {
	max   int
	buf   []byte
	total int64
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// String reports the tail as text (see tailText).
func (t *tailBuffer) String() string {
	b := t.buf
	if len(b) > t.max {
		b = b[len(b)-t.max:]
	}
	return tailText(b, t.total > int64(len(b)), t.max)
}

// ClipString shortens s to at most n bytes on a rune boundary, for quoting
// caller-supplied strings in messages.
func ClipString(s string, n int) string { return wire.ClipString(s, n) }

// clipMessage makes msg fit an ack's error message: valid UTF-8 of at most
// wire.MaxMessageBytes.
func clipMessage(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= wire.MaxMessageBytes {
		return msg
	}
	return ClipString(msg, wire.MaxMessageBytes-len("…"))
}

// handOver makes a run directory the --run-as account's: dir and bodyDir
// (and what lies between) are chowned to it, and the daemon's directories
// above dir (the workdir root, the invocation's directory) become
// searchable by it but stay the daemon's, so it can reach its own run
// directory and nothing else.
func handOver(root, dir, bodyDir string, cred *syscall.Credential) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o711); err != nil {
			return err
		}
		if p == root || p == filepath.Dir(p) {
			break
		}
	}
	for p := bodyDir; ; p = filepath.Dir(p) {
		if err := os.Lchown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
		if p == dir || p == filepath.Dir(p) {
			break
		}
	}
	return nil
}
