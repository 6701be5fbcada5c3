package ids

import (
	"bytes"
	"math"
	"testing"
	"time"

	clk "github.com/dreamlake/lakeshore/shared/clock"
)

func TestNewIsValidAndOrdered(t *testing.T) {
	clock := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	g := &Generator{Clock: clk.Of(func() time.Time { return clock }), Entropy: bytes.NewReader(bytes.Repeat([]byte{7}, 64))}
	a := g.New(Invocation)
	clock = clock.Add(time.Millisecond)
	b := g.New(Invocation)
	if !Valid(Invocation, a) || !Valid(Invocation, b) {
		t.Fatalf("generated ids not valid: %q %q", a, b)
	}
	if a >= b {
		t.Fatalf("ids not ordered by time: %q >= %q", a, b)
	}
}

func TestValid(t *testing.T) {
	good := (&Generator{}).New(Worker)
	cases := []struct {
		name, prefix, id string
		want             bool
	}{
		{"good", Worker, good, true},
		{"wrong prefix", Invocation, good, false},
		{"empty", Worker, "", false},
		{"no ulid", Worker, "wrk_", false},
		{"short", Worker, good[:len(good)-1], false},
		{"bad alphabet", Worker, "wrk_01ARZ3NDEKTSV4RRFFQ69G5FAU", false},
		{"lower case", Worker, "wrk_01arz3ndektsv4rrffq69g5fav", false},
		{"overflow", Worker, "wrk_81ARZ3NDEKTSV4RRFFQ69G5FAV", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Valid(c.prefix, c.id); got != c.want {
				t.Fatalf("Valid(%q, %q) = %v, want %v", c.prefix, c.id, got, c.want)
			}
		})
	}
}

// TestNewIsMonotonicWithinAMillisecond: ids made in the same millisecond
// still sort in creation order, so the claim index stays FIFO under bursts.
func TestNewIsMonotonicWithinAMillisecond(t *testing.T) {
	clock := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	g := &Generator{Clock: clk.Of(func() time.Time { return clock })}
	prev := g.New(Invocation)
	for range 1000 {
		next := g.New(Invocation)
		if next <= prev {
			t.Fatalf("id %q not after %q within one millisecond", next, prev)
		}
		prev = next
	}
}

// TestChild: a child id is well formed and the same every time; children
// of one parent are distinct and sort by n after their parent's time;
// another parent's children differ; a bad parent or n is an error.
func TestChild(t *testing.T) {
	var g Generator
	run, other := g.New(Run), g.New(Run)
	first, err := Child(Invocation, run, 0)
	if err != nil || !Valid(Invocation, first) {
		t.Fatalf("Child(run, 0) = %q, %v", first, err)
	}
	if again, _ := Child(Invocation, run, 0); again != first {
		t.Fatalf("Child is not deterministic: %s then %s", first, again)
	}
	prev := ""
	for n := range 2000 {
		id, err := Child(Invocation, run, n)
		if err != nil || id <= prev {
			t.Fatalf("child %d = %q (%v), not after %q", n, id, err, prev)
		}
		if o, _ := Child(Invocation, other, n); o == id {
			t.Fatalf("child %d of two runs is the same id %s", n, id)
		}
		prev = id
	}
	for _, c := range []struct {
		parent string
		n      int
	}{{"run_nope", 0}, {"", 0}, {run, -1}, {run, MaxChildren}} {
		if id, err := Child(Invocation, c.parent, c.n); err == nil {
			t.Errorf("Child(%q, %d) = %s, want an error", c.parent, c.n, id)
		}
	}
}

func TestBetween(t *testing.T) {
	g := &Generator{}
	lo, hi := g.New(Invocation), g.New(Invocation)
	if got, ok := Between(lo, hi, 0); !ok || got != lo {
		t.Errorf("Between(lo, hi, 0) = %q, %v; want lo %q", got, ok, lo)
	}
	if got, ok := Between(lo, hi, math.MaxUint64); !ok || got < lo || got > hi {
		t.Errorf("Between(lo, hi, max) = %q, %v; want within [%s, %s]", got, ok, lo, hi)
	}
	// A run's jobs: the point is as far into the run as r is into 2⁶⁴.
	run := g.New(Run)
	first, _ := Child(Invocation, run, 0)
	last, _ := Child(Invocation, run, 1000)
	want, _ := Child(Invocation, run, 500)
	if got, ok := Between(first, last, 1<<63); !ok || got != want {
		t.Errorf("Between(job 0, job 1000, half) = %q, %v; want job 500 %q", got, ok, want)
	}
	for _, c := range [][2]string{{hi, lo}, {lo, "wrk_" + hi[4:]}, {"inv_nope", hi}, {lo, "nope"}} {
		if got, ok := Between(c[0], c[1], 1); ok {
			t.Errorf("Between(%q, %q) = %q, true; want refused", c[0], c[1], got)
		}
	}
}
