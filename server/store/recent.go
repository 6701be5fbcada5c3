package store

import "sync"

// recent maps ids to what this process last wrote or read of them, keeping
// the latest maxRecent entries (the oldest put goes first). Its entries are
// hints or facts that never change (an invocation finished): whatever a
// caller decides from a hint is written with a condition on the version it
// read, so a hint that went stale costs a failed write and a read, never a
// wrong answer. The zero value is empty.
type recent[V any] struct {
	mu   sync.Mutex
	byID map[string]recentEntry[V]
	// order is the ids in the order they were put, with the put's seq: an
	// id put again or taken leaves a stale pair behind, which eviction
	// skips.
	order []recentKey
	seq   uint64
}

type recentEntry[V any] struct {
	v   V
	seq uint64
}

type recentKey struct {
	id  string
	seq uint64
}

// maxRecent bounds each recent map: a fleet of up to this many workers
// has all its rows remembered.
const maxRecent = 4096

// put remembers v for id, in place of what was there.
func (r *recent[V]) put(id string, v V) { r.putIf(id, v, nil) }

// putIf is put, unless replace (nil: always) says that what is there
// stays.
func (r *recent[V]) putIf(id string, v V, replace func(old V) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byID[id]; ok && replace != nil && !replace(old.v) {
		return
	}
	if r.byID == nil {
		r.byID = map[string]recentEntry[V]{}
	}
	r.seq++
	r.byID[id] = recentEntry[V]{v, r.seq}
	r.order = append(r.order, recentKey{id, r.seq})
	// Drop the oldest live entries past the limit, and stale pairs at the
	// front; compact once the stale pairs outnumber the live ones, so
	// order stays within twice the limit however often ids are put again.
	for len(r.byID) > maxRecent || (len(r.order) > 0 && r.stale(r.order[0])) {
		if k := r.order[0]; !r.stale(k) {
			delete(r.byID, k.id)
		}
		r.order = r.order[1:]
	}
	if len(r.order) > 2*maxRecent {
		live := make([]recentKey, 0, len(r.byID))
		for _, k := range r.order {
			if !r.stale(k) {
				live = append(live, k)
			}
		}
		r.order = live
	}
}

func (r *recent[V]) stale(k recentKey) bool {
	e, ok := r.byID[k.id]
	return !ok || e.seq != k.seq
}

// get returns what is remembered of id.
func (r *recent[V]) get(id string) (V, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	return e.v, ok
}

// take returns what is remembered of id, and forgets it.
func (r *recent[V]) take(id string) (V, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	delete(r.byID, id)
	return e.v, ok
}

// forget forgets id.
func (r *recent[V]) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byID, id)
}
