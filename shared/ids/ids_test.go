package ids

import (
	"bytes"
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
