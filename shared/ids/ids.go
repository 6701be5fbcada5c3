// Package ids makes and checks the typed identifiers of the wire API:
// a prefix, an underscore and a ULID (wrk_…, inv_…, cmd_…).
package ids

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/oklog/ulid/v2"
)

// The prefixes of the id kinds.
const (
	Worker     = "wrk"
	Invocation = "inv"
	Command    = "cmd"
	Host       = "hst" // a host the provisioner launched (its reservation)
	Run        = "run" // a run of many jobs, each an invocation (Child)
)

// MaxChildren is how many child ids one parent id has (Child's n).
const MaxChildren = 1 << 16

// Child returns the id of kind prefix that is child n of parent, the same
// every time: a run's job n is invocation Child(ids.Invocation, runID, n),
// so a retried submit writes the same items and never a second job. It
// keeps parent's time, so children sort with their parent and, among
// themselves, by n (the claim index hands a run's jobs out in order); the
// rest is a hash of parent, so two parents' children do not meet. It fails
// for a parent that is not an id or n outside [0, MaxChildren).
func Child(prefix, parent string, n int) (string, error) {
	_, rest, ok := strings.Cut(parent, "_")
	id, err := ulid.ParseStrict(rest)
	if !ok || err != nil {
		return "", fmt.Errorf("child of %q: not an id", parent)
	}
	if n < 0 || n >= MaxChildren {
		return "", fmt.Errorf("child %d of %s: out of range 0-%d", n, parent, MaxChildren-1)
	}
	var entropy [10]byte
	sum := sha256.Sum256([]byte(parent))
	copy(entropy[:8], sum[:8])
	binary.BigEndian.PutUint16(entropy[8:], uint16(n))
	var child ulid.ULID
	if err := child.SetTime(id.Time()); err != nil {
		return "", fmt.Errorf("child of %s: %w", parent, err)
	}
	if err := child.SetEntropy(entropy[:]); err != nil {
		return "", fmt.Errorf("child of %s: %w", parent, err)
	}
	return prefix + "_" + child.String(), nil
}

// Generator makes ids from a clock and an entropy source. The zero value uses
// the real clock and crypto/rand; tests set Clock and Entropy.
type Generator struct {
	Clock   clock.Clock
	Entropy io.Reader

	mu        sync.Mutex
	monotonic io.Reader
}

// New returns prefix_ULID. ULIDs sort by creation time, which is what makes
// the claim index hand out the oldest queued work first.
func (g *Generator) New(prefix string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.Clock.Now
	// Monotonic entropy: ids made in the same millisecond still increase,
	// so the claim index hands out a burst of submits in order.
	if g.monotonic == nil {
		src := g.Entropy
		if src == nil {
			src = rand.Reader
		}
		g.monotonic = ulid.Monotonic(src, 0)
	}
	entropy := g.monotonic
	id, err := ulid.New(ulid.Timestamp(now()), entropy)
	if err != nil {
		// Only a failing entropy source gets here; fall back to crypto/rand,
		// which does not fail on supported platforms.
		id = ulid.MustNew(ulid.Timestamp(now()), rand.Reader)
	}
	return prefix + "_" + id.String()
}

// Valid reports whether s is prefix_ followed by a well-formed ULID.
func Valid(prefix, s string) bool {
	rest, ok := strings.CutPrefix(s, prefix+"_")
	// Only the canonical upper-case spelling: ids are DynamoDB keys, and a
	// lower-case twin would name a different item.
	if !ok || len(rest) != ulid.EncodedSize || rest != strings.ToUpper(rest) {
		return false
	}
	_, err := ulid.ParseStrict(rest)
	return err == nil
}

// ValidPrefix reports whether s is the start of an id of kind prefix, in
// its canonical spelling: prefix, "_" and 1 to 26 characters of a ULID's
// alphabet (a search by the first characters of an id).
func ValidPrefix(prefix, s string) bool {
	rest, ok := strings.CutPrefix(s, prefix+"_")
	if !ok || rest == "" || len(rest) > ulid.EncodedSize {
		return false
	}
	return strings.Trim(rest, ulid.Encoding) == "" // a ULID's canonical alphabet
}

// Between returns an id of lo's kind at fraction r/2⁶⁴ of the way from lo
// to hi, two ids of one kind with lo ≤ hi: a claimer that reads the claim
// index from a random point between its first and last entry lands where
// other claimers are unlikely to be. ok is false when either is not an id,
// their kinds differ or hi sorts before lo.
func Between(lo, hi string, r uint64) (id string, ok bool) {
	prefix, loRest, ok1 := strings.Cut(lo, "_")
	hiPrefix, hiRest, ok2 := strings.Cut(hi, "_")
	if !ok1 || !ok2 || prefix != hiPrefix {
		return "", false
	}
	a, errA := ulid.ParseStrict(loRest)
	b, errB := ulid.ParseStrict(hiRest)
	if errA != nil || errB != nil || a.Compare(b) > 0 {
		return "", false
	}
	x := new(big.Int).SetBytes(a[:])
	span := new(big.Int).Sub(new(big.Int).SetBytes(b[:]), x)
	span.Mul(span, new(big.Int).SetUint64(r))
	span.Rsh(span, 64)
	x.Add(x, span)
	var out ulid.ULID
	x.FillBytes(out[:])
	return prefix + "_" + out.String(), true
}
