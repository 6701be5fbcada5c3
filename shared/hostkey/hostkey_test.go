package hostkey

import (
	"strings"
	"testing"
)

func TestOf(t *testing.T) {
	if got := Of(nil); got != "" {
		t.Fatalf("Of(nil) = %q, want empty", got)
	}
	a := Of([]string{"apt-get install -y jq"})
	if !strings.HasPrefix(a, Prefix) || len(a) != len(Prefix)+64 {
		t.Fatalf("Of = %q, want hk1_ and 64 hex digits", a)
	}
	if a != Of([]string{"apt-get install -y jq"}) {
		t.Fatal("Of is not deterministic")
	}
	distinct := [][]string{{"a b"}, {"a", "b"}, {"b", "a"}, {"ab"}, {"a", "b", ""}, {""}}
	seen := map[string][]string{}
	for _, s := range distinct {
		k := Of(s)
		if prev, ok := seen[k]; ok {
			t.Fatalf("Of(%q) == Of(%q)", s, prev)
		}
		seen[k] = s
	}
}

// pinned was computed independently: printf '\x00\x00\x00\x01\x00\x00\x00\x07echo hi' | sha256sum
const pinned = "hk1_25f0c8ce3966e768964e4fbc531d8cd690df8abbb63d261b4c97f5324bbb8882"

// TestOfKnownValue pins the encoding: daemons and control planes of
// different versions must agree on it.
func TestOfKnownValue(t *testing.T) {
	if got := Of([]string{"echo hi"}); got != pinned {
		t.Fatalf("Of([echo hi]) = %s, want %s (the encoding changed; bump the prefix instead)", got, pinned)
	}
}
