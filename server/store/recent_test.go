package store

import (
	"fmt"
	"testing"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// TestRecentKeepsTheLatest: a recent map holds at most maxRecent entries,
// forgets the oldest put first (an id put again counts from its last put),
// and its order of puts stays within twice the bound however often the
// same ids are put again.
func TestRecentKeepsTheLatest(t *testing.T) {
	var r recent[int]
	for i := range maxRecent {
		r.put(fmt.Sprint(i), i)
	}
	r.put("0", -1) // put again: now the latest
	r.put("new", 1)
	if _, ok := r.get("1"); ok {
		t.Errorf("the oldest entry is still held past the bound")
	}
	if v, ok := r.get("0"); !ok || v != -1 {
		t.Errorf("an entry put again was forgotten as if it were the oldest: %d, %v", v, ok)
	}
	if len(r.byID) != maxRecent {
		t.Errorf("%d entries, want %d", len(r.byID), maxRecent)
	}
	for range 10 * maxRecent {
		r.put("0", 0)
	}
	if len(r.order) > 2*maxRecent {
		t.Errorf("the order holds %d pairs for %d entries", len(r.order), len(r.byID))
	}
	if v, ok := r.take("0"); !ok || v != 0 {
		t.Errorf("take = %d, %v", v, ok)
	}
	if _, ok := r.get("0"); ok {
		t.Errorf("a taken entry is still held")
	}
	r.put("a", 1)
	r.putIf("a", 0, func(old int) bool { return old < 0 })
	if v, _ := r.get("a"); v != 1 {
		t.Errorf("putIf replaced what it was told to keep: %d", v)
	}
	r.putIf("a", 2, func(old int) bool { return old <= 2 })
	if v, _ := r.get("a"); v != 2 {
		t.Errorf("putIf kept what it was told to replace: %d", v)
	}
}

// TestRememberedWorkerKeepsTheLatestVersion: a read that answers after a
// later write (an older version) does not replace the row remembered.
func TestRememberedWorkerKeepsTheLatestVersion(t *testing.T) {
	s := &Store{RememberWrites: true}
	s.rememberWorker(domain.Worker{ID: "w", Version: 5})
	s.rememberWorker(domain.Worker{ID: "w", Version: 4})
	if w, _ := s.workers.get("w"); w.Version != 5 {
		t.Errorf("remembered version %d after an older read, want 5 kept", w.Version)
	}
	s.rememberWorker(domain.Worker{ID: "w", Version: 6})
	if w, _ := s.workers.get("w"); w.Version != 6 {
		t.Errorf("remembered version %d, want 6", w.Version)
	}
	off := &Store{}
	off.rememberWorker(domain.Worker{ID: "w", Version: 1})
	if _, ok := off.workers.get("w"); ok {
		t.Errorf("a store without RememberWrites remembered a row")
	}
}
