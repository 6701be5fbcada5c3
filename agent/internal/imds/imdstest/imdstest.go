// Package imdstest is a fake EC2 instance metadata service (IMDSv2 only) on
// a loopback socket, for the tests of what reads IMDS — the spot watcher
// (agent/internal/spot), IAM-mode signing (agent/internal/sigv4) — and of
// the agent that wires them. Only tests link it: make check refuses a
// binary that does.
package imdstest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// The instance role the fake hands out.
const (
	Role         = "lakeshore-fleet"
	KeyID        = "ASIAFAKEKEYFORTESTS1"
	Secret       = "fake/secret/key/for/tests/only/0123456789"
	SessionToken = "FwoGZXIvYXdzEFakeSessionTokenForTests//"
)

// Creds are the role's credentials, for a verifier to sign with.
var Creds = aws.Credentials{AccessKeyID: KeyID, SecretAccessKey: Secret, SessionToken: SessionToken}

// State is what the fake serves; change it with Server.Set.
type State struct {
	Region    string    // placement/region; "": 404
	NoRole    bool      // no instance profile: the role paths are 404
	Action    string    // spot/instance-action's action; "": no interruption notice
	At        time.Time // spot/instance-action's time
	Rebalance time.Time // events/recommendations/rebalance's noticeTime; zero: none
	Fail      bool      // every request answers 500
}

// Server is the fake. PUT /latest/api/token issues a token that lives for
// the TTL asked (echoing it, as the SDK requires); the metadata paths
// answer only a GET carrying a live token (401 otherwise, counted in
// Tokenless), and 404 for what State says is not there.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	state    State
	tokens   map[string]time.Time // token → expiry
	answered chan struct{}        // closed and replaced as each request is answered

	TokenPUTs atomic.Int32
	Gets      atomic.Int32 // every metadata GET, answered or refused
	Tokenless atomic.Int32 // GETs refused for a missing, unknown or expired token: IMDSv1
	RoleLists atomic.Int32 // GET iam/security-credentials/
	CredGETs  atomic.Int32 // GET iam/security-credentials/<Role>
	Regions   atomic.Int32 // GET placement/region
	nextToken atomic.Int32
}

// New starts the fake serving init; it stops when t ends.
func New(t testing.TB, init State) *Server {
	t.Helper()
	f := &Server{state: init, tokens: map[string]time.Time{}, answered: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", f.token)
	mux.HandleFunc("GET /latest/meta-data/", f.metadata)
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *Server) token(w http.ResponseWriter, r *http.Request) {
	f.TokenPUTs.Add(1)
	defer f.wake()
	if f.Serving().Fail {
		http.Error(w, "down", http.StatusInternalServerError)
		return
	}
	ttl, err := strconv.Atoi(r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
	if err != nil || ttl < 1 || ttl > 21600 {
		http.Error(w, "bad TTL", http.StatusBadRequest)
		return
	}
	tok := fmt.Sprintf("token-%d", f.nextToken.Add(1))
	f.mu.Lock()
	f.tokens[tok] = time.Now().Add(time.Duration(ttl) * time.Second)
	f.mu.Unlock()
	w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", strconv.Itoa(ttl))
	_, _ = io.WriteString(w, tok)
}

func (f *Server) metadata(w http.ResponseWriter, r *http.Request) {
	f.Gets.Add(1)
	defer f.wake()
	f.mu.Lock()
	st := f.state
	exp, ok := f.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
	f.mu.Unlock()
	if st.Fail {
		http.Error(w, "down", http.StatusInternalServerError)
		return
	}
	if !ok || time.Now().After(exp) {
		f.Tokenless.Add(1)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/latest/meta-data/iam/security-credentials/":
		f.RoleLists.Add(1)
		if st.NoRole {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, Role)
	case "/latest/meta-data/iam/security-credentials/" + Role:
		f.CredGETs.Add(1)
		if st.NoRole {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{
			"Code": "Success", "Type": "AWS-HMAC",
			"LastUpdated":     time.Now().UTC().Format(time.RFC3339),
			"AccessKeyId":     KeyID,
			"SecretAccessKey": Secret,
			"Token":           SessionToken,
			"Expiration":      time.Now().Add(6 * time.Hour).UTC().Format(time.RFC3339),
		})
	case "/latest/meta-data/placement/region":
		f.Regions.Add(1)
		if st.Region == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, st.Region)
	case "/latest/meta-data/spot/instance-action":
		if st.Action == "" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"action": st.Action, "time": st.At.UTC().Format(time.RFC3339)})
	case "/latest/meta-data/events/recommendations/rebalance":
		if st.Rebalance.IsZero() {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"noticeTime": st.Rebalance.UTC().Format(time.RFC3339)})
	default:
		http.NotFound(w, r)
	}
}

// Serving reports what the fake serves now.
func (f *Server) Serving() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state
}

// Set changes what the fake serves.
func (f *Server) Set(mod func(*State)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mod(&f.state)
}

// RevokeTokens forgets every token issued, as a restarted IMDS would.
func (f *Server) RevokeTokens() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.tokens)
}

// wake tells WaitFor that a request was answered (its counter moved
// before).
func (f *Server) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.answered)
	f.answered = make(chan struct{})
}

// WaitFor waits until cond holds, checking it again as each request is
// answered, for at most within (generous: a test asserts what happened,
// never how fast).
func (f *Server) WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		answered := f.answered
		f.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-answered:
		case <-deadline.C:
			t.Fatalf("%s: not within %s (token PUTs %d, GETs %d)", what, within, f.TokenPUTs.Load(), f.Gets.Load())
		}
	}
}
