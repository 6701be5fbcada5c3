// Package display decides how a string someone else supplied — a worker's
// label or setup command, a submitter's argv, a body's error or output — is
// shown to an operator, in the web view and in the CLI's tables: every
// character that would not show as itself is shown as an escape. That is
// control characters (terminal escapes: they could move the cursor,
// recolour or retitle a terminal, or break a table), Unicode format
// characters (bidi overrides and isolates such as U+202E, which reorder
// what follows them so a label or an argv reads as something it is not;
// zero-width characters) and line and paragraph separators. Bytes that are
// not UTF-8 show as U+FFFD.
package display

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line shows s on one line: every hidden character escaped (Hidden).
func Line(s string) string { return escape(s, false) }

// Block shows s as text of several lines: newlines and tabs are kept, every
// other hidden character escaped.
func Block(s string) string { return escape(s, true) }

// Hidden reports whether r would not show as itself: a control character
// (C0, DEL, C1), a format character (Unicode category Cf: bidi controls,
// zero-width characters, the byte-order mark, tags) or a line or paragraph
// separator.
func Hidden(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Escape writes r as Line shows a hidden character: \x1b below U+0100,
// \u202e up to U+FFFF, \U000e0001 beyond.
func Escape(r rune) string {
	switch {
	case r < 0x100:
		return fmt.Sprintf(`\x%02x`, r)
	case r <= 0xffff:
		return fmt.Sprintf(`\u%04x`, r)
	}
	return fmt.Sprintf(`\U%08x`, r)
}

func escape(s string, block bool) string {
	kept := func(r rune) bool { return block && (r == '\n' || r == '\t') }
	clean := utf8.ValidString(s)
	for _, r := range s {
		if !clean {
			break
		}
		clean = !Hidden(r) || kept(r)
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s { // a byte that is not UTF-8 ranges as U+FFFD
		if Hidden(r) && !kept(r) {
			b.WriteString(Escape(r))
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}
