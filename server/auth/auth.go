// Package auth holds the three kinds of bearer token (docs/design.md §9): the
// enrollment token (hello only), the per-worker token issued at hello, and
// the operator token. Comparisons are constant time; only a SHA-256 hash of a
// worker token is ever stored.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"regexp"
	"strings"
)

// Daemon authentication modes (LAKESHORE_DAEMON_AUTH, docs/security.md).
const (
	// DaemonAuthToken: daemon routes carry their token in Authorization.
	DaemonAuthToken = "token"
	// DaemonAuthIAM: the daemon routes sit behind API Gateway's AWS_IAM
	// authorizer (template-iam.yaml). Authorization carries the SigV4
	// signature, so the token moves to wire.TokenHeader, and every daemon call
	// must come from the EC2 instance its machine_id names: a stolen
	// enrollment or worker token is useless off that instance.
	DaemonAuthIAM = "iam"
)

// instanceRoleSession matches the caller ARN of an EC2 instance profile
// session, whose session name is the instance id.
var instanceRoleSession = regexp.MustCompile(`^arn:aws[a-z-]*:sts::[0-9]{12}:assumed-role/[A-Za-z0-9+=,.@_-]+/(i-[0-9a-f]{8,17})$`)

// CallerInstance reports the EC2 instance whose role session the caller ARN
// names (IAM mode: API Gateway's AWS_IAM authorizer verified it), and false
// for any other caller.
func CallerInstance(callerARN string) (string, bool) {
	m := instanceRoleSession.FindStringSubmatch(callerARN)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// SameInstance reports whether a caller from instance may act for a
// worker of machineID: in IAM mode only from that instance; in token mode
// (instance "") always.
func SameInstance(instance, machineID string) bool {
	return instance == "" || instance == machineID
}

// workerTokenPrefix starts every worker token: "wtk_<worker ulid>_<secret>".
// The worker id inside lets the control plane find the row to check against
// and answer 403 (not 401) when a valid token acts for another worker.
const workerTokenPrefix = "wtk_"

// Bearer reports the token of an "Authorization: Bearer T" header, or "".
func Bearer(r *http.Request) string {
	return BearerValue(r.Header.Get("Authorization"))
}

// BearerValue returns the token of an Authorization header value
// ("Bearer <token>"), or "".
func BearerValue(h string) string {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// Equal reports whether two secrets are equal, in time independent of where
// they differ. Both are hashed first so the length does not leak either.
// EqualAny reports whether got is one of wants (ignoring empty ones), in
// time that does not depend on which: a current and a previous token
// during a rotation (docs/operations.md).
func EqualAny(got string, wants ...string) bool {
	ok := false
	for _, w := range wants {
		ok = Equal(got, w) || ok // every one compared, whatever the first said
	}
	return ok
}

func Equal(got, want string) bool {
	if want == "" {
		return false
	}
	a := sha256.Sum256([]byte(got))
	b := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// Hash reports the stored form of a worker token.
func Hash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// HashMatches reports, in constant time, whether token hashes to stored.
// An empty stored hash (no such worker, or none issued) never matches, and
// costs the same hash and compare as one that does not match.
func HashMatches(token, stored string) bool {
	got := Hash(token)
	want := stored
	if want == "" {
		want = noHash
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 && stored != ""
}

// noHash stands in for a missing stored hash: a hash's length, so the
// compare takes its usual time.
var noHash = strings.Repeat("0", 2*sha256.Size)

// NewWorkerToken returns a fresh token for workerID ("wrk_…") and its hash.
func NewWorkerToken(workerID string) (token, hash string, err error) {
	secret, err := Random(32)
	if err != nil {
		return "", "", err
	}
	token = workerTokenPrefix + strings.TrimPrefix(workerID, "wrk_") + "_" + secret
	return token, Hash(token), nil
}

// WorkerOf reports the worker id a worker token was issued to, and false
// when tok is not shaped like a worker token.
func WorkerOf(tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, workerTokenPrefix)
	if !ok {
		return "", false
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || id == "" || secret == "" {
		return "", false
	}
	return "wrk_" + id, true
}

// Random returns n random bytes, base64url without padding.
func Random(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
