package display_test

import (
	"testing"

	"github.com/dreamlake/lakeshore/shared/display"
)

func TestLineAndBlock(t *testing.T) {
	for _, tc := range []struct {
		name, in, line, block string
	}{
		{"plain", "worker-1 ünïcode 日本", "worker-1 ünïcode 日本", "worker-1 ünïcode 日本"},
		{"empty", "", "", ""},
		{"right-to-left override", "invoice\u202efdp.exe", `invoice\u202efdp.exe`, `invoice\u202efdp.exe`},
		{"bidi isolates and marks", "a\u2066b\u2069c\u200fd\u061ce", `a\u2066b\u2069c\u200fd\u061ce`, `a\u2066b\u2069c\u200fd\u061ce`},
		{"zero width", "ad\u200bmin\u200d\ufeff", `ad\u200bmin\u200d\ufeff`, `ad\u200bmin\u200d\ufeff`},
		{"soft hyphen", "pay\u00adpal", `pay\xadpal`, `pay\xadpal`},
		{"tag character", "x\U000e0041", `x\U000e0041`, `x\U000e0041`},
		{"terminal escape", "\x1b[31mred\x1b]0;title\x07", `\x1b[31mred\x1b]0;title\x07`, `\x1b[31mred\x1b]0;title\x07`},
		{"C1 and DEL", "a\u009bb\x7f", `a\x9bb\x7f`, `a\x9bb\x7f`},
		{"newline, tab, carriage return", "a\nb\tc\rd", `a\x0ab\x09c\x0dd`, "a\nb\tc\\x0dd"},
		{"line and paragraph separators", "a\u2028b\u2029c", `a\u2028b\u2029c`, `a\u2028b\u2029c`},
		{"not UTF-8", "a\xffb\xc3", "a\uFFFDb\uFFFD", "a\uFFFDb\uFFFD"},
		{"backslash stays", `C:\new`, `C:\new`, `C:\new`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := display.Line(tc.in); got != tc.line {
				t.Errorf("Line(%q) = %q, want %q", tc.in, got, tc.line)
			}
			if got := display.Block(tc.in); got != tc.block {
				t.Errorf("Block(%q) = %q, want %q", tc.in, got, tc.block)
			}
		})
	}
}

func TestHidden(t *testing.T) {
	for r, want := range map[rune]bool{
		'a': false, ' ': false, 'é': false, '日': false, '\u00a0': false, '\uFFFD': false,
		0: true, '\n': true, 0x1b: true, 0x7f: true, 0x85: true, '\u202e': true, '\u202a': true,
		'\u2067': true, '\u200b': true, '\ufeff': true, '\u2028': true, '\U000e0001': true,
	} {
		if got := display.Hidden(r); got != want {
			t.Errorf("Hidden(%U) = %v, want %v", r, got, want)
		}
	}
}
