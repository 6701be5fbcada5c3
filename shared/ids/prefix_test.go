package ids_test

import (
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/ids"
)

// TestValidPrefix: the start of an id of a kind in its canonical spelling
// (1 to 26 characters of a ULID's alphabet after the kind's prefix), and
// nothing else: not another kind's, not lower case, not past an id's
// length, not a character outside the alphabet (such as "~", which would
// widen a key range).
func TestValidPrefix(t *testing.T) {
	id := (&ids.Generator{}).New(ids.Invocation)
	for _, c := range []struct {
		s    string
		want bool
	}{
		{id, true}, {id[:5], true}, {"inv_01M8YX", true},
		{"inv_", false}, {"inv", false}, {"", false}, {"01M8", false}, {"wrk_01M8", false},
		{"inv_01m8", false}, {"inv_01IL", false}, {"inv_0~", false}, {"inv_0 ", false}, {id + "0", false},
		{"inv_" + strings.Repeat("Z", 26), true},
	} {
		if got := ids.ValidPrefix(ids.Invocation, c.s); got != c.want {
			t.Errorf("ValidPrefix(inv, %q) = %v, want %v", c.s, got, c.want)
		}
	}
}
