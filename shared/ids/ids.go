// Package ids makes and checks the typed identifiers of the wire API:
// a prefix, an underscore and a ULID (wrk_…, inv_…, cmd_…).
package ids

import (
	"crypto/rand"
	"io"
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
)

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
