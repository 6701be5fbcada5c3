package ui

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestANSIHTML: SGR colours and weights become spans of fixed classes,
// nested codes combine, resets end them; every other escape sequence is
// dropped whole; text, hidden characters and markup are escaped.
func TestANSIHTML(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "hello\nworld\n", "hello\nworld\n"},
		{"red then reset", "\x1b[31mRED\x1b[0m ok", `<span class="ansi-fg-1">RED</span> ok`},
		{"bright and background", "\x1b[91;104mx\x1b[39my\x1b[49mz", `<span class="ansi-fg-9 ansi-bg-12">x</span><span class="ansi-bg-12">y</span>z`},
		{"bold nests in a colour", "\x1b[32mg\x1b[1mG\x1b[22mg\x1b[mz", `<span class="ansi-fg-2">g</span><span class="ansi-fg-2 ansi-bold">G</span><span class="ansi-fg-2">g</span>z`},
		{"empty code resets", "\x1b[1;33mA\x1b[mB", `<span class="ansi-fg-3 ansi-bold">A</span>B`},
		{"colour carries over lines", "\x1b[31ma\nb\x1b[0m\n", `<span class="ansi-fg-1">a` + "\nb</span>\n"},
		{"256 colours", "\x1b[38;5;9ma\x1b[38;5;196mb\x1b[48;5;21mc\x1b[38;5;244md", `<span class="ansi-fg-9">ab</span><span class="ansi-fg-9 ansi-bg-4">c</span><span class="ansi-fg-8 ansi-bg-4">d</span>`},
		{"RGB", "\x1b[38;2;250;10;10mr\x1b[38:2:0:200:0mg", `<span class="ansi-fg-9">r</span><span class="ansi-fg-2">g</span>`},
		{"attributes", "\x1b[2;3;4mx\x1b[23;24my", `<span class="ansi-dim ansi-italic ansi-underline">x</span><span class="ansi-dim">y</span>`},
		{"unknown SGR codes ignored", "\x1b[5;7;53;999999999999mx", "x"},
		{"38 cut short", "\x1b[38;5mx\x1b[38;2;1mx\x1b[38mx", "xxx"},
		{"cursor moves dropped", "a\x1b[2K\x1b[1;1Hb\x1b[?25lc", "abc"},
		{"private SGR-like dropped", "\x1b[?31mx\x1b[>1m", "x"},
		{"intermediate before m is not SGR", "\x1b[31 mx", "x"},
		{"title (OSC, BEL)", "a\x1b]0;pwned\x07b", "ab"},
		{"hyperlink (OSC, ST)", "\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"unterminated OSC ends at its line", "a\x1b]0;title\nnext", "a\nnext"},
		{"DCS and APC", "a\x1bPq#0\x1b\\b\x1b_x\x07c", "abc"},
		{"two-byte escapes", "a\x1b7b\x1b8c\x1b(Bd\x1bce", "abcde"},
		{"cut off at the end", "ok\x1b[3", "ok"},
		{"lone ESC at the end", "ok\x1b", "ok"},
		{"cut off OSC at the end", "ok\x1b]0;ti", "ok"},
		{"a CSI broken by a newline", "a\x1b[3\nb", "a\nb"},
		{"split at a tail's start: no ESC, text", "1;31mred\x1b[0m", "1;31mred"},
		{"markup is text", "\x1b[31m<script>alert(1)</script>&\"'", `<span class="ansi-fg-1">&lt;script&gt;alert(1)&lt;/script&gt;&amp;&#34;&#39;</span>`},
		{"no markup through a code", "\x1b[31;\"><b>m x", `&gt;&lt;b&gt;m x`},
		{"hidden characters escaped", "a\rb\u202ec\x00d\tz", `a\x0db\u202ec\x00d` + "\tz"},
		{"CRLF as a line end", "a\r\nb\r\n", "a\nb\n"},
		{"C1 CSI shown, not run", "a\u009b31mb", `a\x9b31mb`},
		{"not UTF-8", "a\xffb", "a\uFFFDb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(ansiHTML(tc.in)); got != tc.want {
				t.Errorf("ansiHTML(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

// FuzzANSI: whatever a body prints, the rendering is valid UTF-8 whose
// only tags are spans of the renderer's fixed classes, balanced and never
// nested, with no ESC and no bare < or > left in its text, and no bigger
// than the input's escapes account for.
func FuzzANSI(f *testing.F) {
	for _, s := range []string{"", "plain\n", "\x1b[31mred\x1b[0m", "\x1b[38;5;200;48;2;1;2;3;1mx", "\x1b]0;t\x07\x1b[2Jy",
		"<b>\x1b[1m&amp;</b>", "\x1b[", "\x1b]", "\x1bP", "\x1b[31;\"><script>m", "\xff\xfe\x1b[9999999999999999999m"} {
		f.Add(s)
	}
	tag := regexp.MustCompile(`<[^>]*>`)
	allowed := regexp.MustCompile(`^(</span>|<span class="(ansi-(fg|bg)-([0-9]|1[0-5])|ansi-(bold|dim|italic|underline))( ansi-(fg|bg)-([0-9]|1[0-5])| ansi-(bold|dim|italic|underline))*">)$`)
	f.Fuzz(func(t *testing.T, in string) {
		out := string(ansiHTML(in))
		if !utf8.ValidString(out) {
			t.Fatalf("not UTF-8: %q", out)
		}
		if strings.ContainsRune(out, 0x1b) {
			t.Fatalf("an ESC is left in %q", out)
		}
		depth := 0
		for _, m := range tag.FindAllString(out, -1) {
			if !allowed.MatchString(m) {
				t.Fatalf("tag %q in the rendering of %q", m, in)
			}
			if m == "</span>" {
				depth--
			} else {
				depth++
			}
			if depth < 0 || depth > 1 {
				t.Fatalf("spans nest or close unopened (depth %d) in %q", depth, out)
			}
		}
		if depth != 0 {
			t.Fatalf("a span left open in %q", out)
		}
		text := tag.ReplaceAllString(out, "")
		if strings.ContainsAny(text, "<>") {
			t.Fatalf("markup characters left as such in %q", out)
		}
		if len(text) > 10*len(in)+16 {
			t.Fatalf("the rendering of %d bytes is %d bytes of text", len(in), len(text))
		}
	})
}
