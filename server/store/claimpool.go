package store

import (
	"slices"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// claimPool holds, per claim partition, the candidates one claim query read
// that no claimer of this process has tried yet. Claimers of one process
// (the polls a `lakeshore dev` or one Lambda instance serves) take distinct
// candidates from it instead of each querying the index and racing for its
// head: one query serves up to a window of claims, and they never lose a
// conditional write to each other. Entries are hints: each is claimed by a
// conditional put on the version read, so one that changed since (claimed
// by another process, cancelled) only costs a lost write, after which the
// pool of that partition is dropped and read again (Store.Claim).
type claimPool struct {
	mu    sync.Mutex
	parts map[string]*poolPart
}

type poolPart struct {
	mu   sync.Mutex
	invs []domain.Invocation // shuffled; taken from the end
	read time.Time           // when the query that filled it ran
	full bool                // that query filled its window: more may be queued
	// contendedUntil: other processes claim from this partition too (a
	// pooled candidate was lost to one). Until then every take reads the
	// index afresh, as pooled candidates would mostly be gone.
	contendedUntil time.Time
	// trying holds the candidates handed out whose put has not finished:
	// a read meanwhile still finds them queued, and must not pool them.
	trying map[string]bool
	// span is the partition's first and last entry as last read, for
	// contended reads from a random point between them.
	span claimSpan
}

// claimSpan is the first and last id of a claim partition when read.
type claimSpan struct {
	head, tail string
	read       time.Time
}

// contendedFor is how long a lost race turns the pool of its partition off.
const contendedFor = 10 * time.Second

// spreadPoolTTL is how long candidates of a spread read are kept: long
// enough to serve the rest of one poll's claims (a worker with capacity
// for several), short enough that other processes have seldom taken them.
const spreadPoolTTL = 100 * time.Millisecond

func (p *claimPool) part(key string) *poolPart {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.parts == nil {
		p.parts = map[string]*poolPart{}
	}
	pp, ok := p.parts[key]
	if !ok {
		pp = &poolPart{}
		p.parts[key] = pp
	}
	return pp
}

// take hands out one candidate of partition key, filling the pool with
// refill first when it is empty or older than ttl (refill runs under the
// partition's lock: claimers that arrive meanwhile wait for its result
// rather than query too). refill is told how many candidates this process
// is trying now: a read finds those again, so it should read that many
// more. With spread set, or while other processes claim from the
// partition too (contended), candidates are kept at most spreadPoolTTL and
// refill gets the partition's span, to read from a random point of it;
// otherwise span is nil and refill reads the head. ok is false when the
// partition has no candidate; full reports whether the last read filled
// its window.
func (p *claimPool) take(key string, now time.Time, ttl time.Duration, spread bool, refill func(trying int, span *claimSpan) ([]domain.Invocation, bool, error)) (inv domain.Invocation, ok, full bool, err error) {
	pp := p.part(key)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	var span *claimSpan
	if spread || now.Before(pp.contendedUntil) {
		ttl, span = min(ttl, spreadPoolTTL), &pp.span
	}
	if len(pp.invs) == 0 || now.Sub(pp.read) > ttl {
		invs, full, err := refill(len(pp.trying), span)
		if err != nil {
			pp.invs = nil
			return domain.Invocation{}, false, false, err
		}
		pp.invs = slices.DeleteFunc(invs, func(inv domain.Invocation) bool { return pp.trying[inv.ID] })
		// A read that found only candidates this process is trying says
		// nothing about more work: reading again at once would find them
		// again.
		pp.read, pp.full = now, full && len(pp.invs) > 0
	}
	if len(pp.invs) == 0 {
		return domain.Invocation{}, false, pp.full, nil
	}
	inv = pp.invs[len(pp.invs)-1]
	pp.invs = pp.invs[:len(pp.invs)-1]
	if pp.trying == nil {
		pp.trying = map[string]bool{}
	}
	pp.trying[inv.ID] = true
	return inv, true, pp.full, nil
}

// tried reports that the put of candidate id of partition key finished
// (won, lost or failed).
func (p *claimPool) tried(key, id string) {
	pp := p.part(key)
	pp.mu.Lock()
	delete(pp.trying, id)
	pp.mu.Unlock()
}

// contended forgets partition key's candidates, which are going stale
// under other processes' claims, and reads the index afresh for every
// claim of the partition until contendedFor has passed.
func (p *claimPool) contended(key string, now time.Time) {
	pp := p.part(key)
	pp.mu.Lock()
	pp.invs = nil
	pp.contendedUntil = now.Add(contendedFor)
	pp.mu.Unlock()
}

// claimedEntry is what the ack needs of an invocation this store claimed,
// as it wrote it (Store.claimed).
type claimedEntry struct {
	inv    domain.Invocation
	worker domain.Worker
}
