package ui

import (
	"html/template"
	"strconv"
	"strings"
)

// ansiHTML renders a body's output as the invocation page shows it: its
// SGR colours and weights (ESC [ … m) as spans of a fixed set of classes
// (app.css), every other escape sequence dropped whole, the text escaped
// (hidden characters as display.Block shows them, markup by html/template's
// escaper). Nothing of the output reaches the page as markup: the only
// tags written are <span class="ansi-…"> and </span>, and each class name
// comes from a number the renderer bounds, never from the output's text.
func ansiHTML(s string) template.HTML {
	var r ansiRenderer
	r.write(s)
	return r.html()
}

// sgr is the look of the text a sequence of SGR codes leaves: its colours
// (1-16: colour n-1 of the 16; 0: the default) and attributes. The zero
// value is plain text.
type sgr struct {
	fg, bg                       int
	bold, dim, italic, underline bool
}

// classes is the class attribute of text in look g ("" for plain text).
func (g sgr) classes() string {
	var c []string
	if g.fg > 0 {
		c = append(c, "ansi-fg-"+strconv.Itoa(g.fg-1))
	}
	if g.bg > 0 {
		c = append(c, "ansi-bg-"+strconv.Itoa(g.bg-1))
	}
	for _, a := range []struct {
		on   bool
		name string
	}{{g.bold, "ansi-bold"}, {g.dim, "ansi-dim"}, {g.italic, "ansi-italic"}, {g.underline, "ansi-underline"}} {
		if a.on {
			c = append(c, a.name)
		}
	}
	return strings.Join(c, " ")
}

// ansiRenderer renders output written to it in pieces (the look carries
// from one piece to the next) as HTML.
type ansiRenderer struct {
	b    strings.Builder
	look sgr
	// open is the class of the span written last and not yet closed; ""
	// is none.
	open string
}

// write renders s: text, SGR sequences, other sequences dropped. A
// sequence cut off at the end of s is dropped.
func (r *ansiRenderer) write(s string) {
	for len(s) > 0 {
		i := strings.IndexByte(s, 0x1b)
		if i < 0 {
			r.text(s)
			return
		}
		r.text(s[:i])
		n, codes, isSGR := escapeSequence(s[i:])
		if isSGR {
			r.look = r.look.apply(codes)
		}
		s = s[i+n:]
	}
}

// note writes the page's own words into the output, marked as such.
func (r *ansiRenderer) note(s string) {
	r.close()
	r.b.WriteString(`<span class="ansi-note">`)
	r.b.WriteString(template.HTMLEscapeString(printableLog(s)))
	r.b.WriteString(`</span>`)
}

// text writes s in the current look.
func (r *ansiRenderer) text(s string) {
	if s == "" {
		return
	}
	// CRLF line ends read as line ends; a lone CR stays visible (escaped).
	s = strings.ReplaceAll(s, "\r\n", "\n")
	if c := r.look.classes(); c != r.open {
		r.close()
		if c != "" {
			r.b.WriteString(`<span class="`)
			r.b.WriteString(c)
			r.b.WriteString(`">`)
			r.open = c
		}
	}
	r.b.WriteString(template.HTMLEscapeString(printableLog(s)))
}

func (r *ansiRenderer) close() {
	if r.open != "" {
		r.b.WriteString("</span>")
		r.open = ""
	}
}

// html closes what is open and returns what was rendered.
func (r *ansiRenderer) html() template.HTML {
	r.close()
	// Built only of escaped text and the fixed span tags above.
	return template.HTML(r.b.String())
}

// escapeSequence reads the escape sequence s starts with (s[0] is ESC) and
// reports its length, and for an SGR sequence (CSI … m) its codes. A CSI
// ends at its final byte (0x40-0x7e); a byte outside its grammar ends it
// before that byte. A string sequence (OSC, DCS, SOS, PM, APC) ends at BEL
// or ST (ESC \); one with neither on its line ends at the line's end, so a
// stray ESC ] cannot hide the rest of the output. Other escapes are ESC,
// any intermediate bytes (0x20-0x2f) and one final byte.
func escapeSequence(s string) (n int, codes []int, isSGR bool) {
	if len(s) < 2 {
		return len(s), nil, false
	}
	switch s[1] {
	case '[':
		i := 2
		for i < len(s) && s[i] >= 0x30 && s[i] <= 0x3f { // parameters
			i++
		}
		params := s[2:i]
		j := i
		for j < len(s) && s[j] >= 0x20 && s[j] <= 0x2f { // intermediates
			j++
		}
		if j >= len(s) || s[j] < 0x40 || s[j] > 0x7e {
			return j, nil, false // cut off or malformed: dropped up to here
		}
		if s[j] == 'm' && j == i {
			if codes, ok := sgrCodes(params); ok {
				return j + 1, codes, true
			}
		}
		return j + 1, nil, false
	case ']', 'P', 'X', '^', '_':
		for i := 2; i < len(s); i++ {
			switch {
			case s[i] == 0x07:
				return i + 1, nil, false
			case s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\':
				return i + 2, nil, false
			case s[i] == '\n':
				return i, nil, false
			}
		}
		return len(s), nil, false
	}
	i := 1
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
		i++
	}
	if i < len(s) && s[i] >= 0x30 && s[i] <= 0x7e {
		i++
	}
	return i, nil, false
}

// maxSGRCodes bounds the codes of one SGR sequence read.
const maxSGRCodes = 32

// sgrCodes reads the codes of an SGR sequence's parameters ("" is 0);
// ':' separates as ';' does. A private or malformed one (with < = > ?) is
// not SGR.
func sgrCodes(params string) ([]int, bool) {
	if params == "" {
		return []int{0}, true
	}
	var codes []int
	start := 0
	for i := 0; i <= len(params) && len(codes) < maxSGRCodes; i++ {
		if i < len(params) && params[i] != ';' && params[i] != ':' {
			if params[i] < '0' || params[i] > '9' {
				return nil, false
			}
			continue
		}
		n := 0
		for _, d := range params[start:i] {
			n = min(n*10+int(d-'0'), 1<<16)
		}
		codes = append(codes, n)
		start = i + 1
	}
	return codes, true
}

// apply reports the look after codes.
func (g sgr) apply(codes []int) sgr {
	for i := 0; i < len(codes); i++ {
		switch c := codes[i]; {
		case c == 0:
			g = sgr{}
		case c == 1:
			g.bold = true
		case c == 2:
			g.dim = true
		case c == 3:
			g.italic = true
		case c == 4:
			g.underline = true
		case c == 22:
			g.bold, g.dim = false, false
		case c == 23:
			g.italic = false
		case c == 24:
			g.underline = false
		case c >= 30 && c <= 37:
			g.fg = c - 30 + 1
		case c >= 90 && c <= 97:
			g.fg = c - 90 + 8 + 1
		case c == 39:
			g.fg = 0
		case c >= 40 && c <= 47:
			g.bg = c - 40 + 1
		case c >= 100 && c <= 107:
			g.bg = c - 100 + 8 + 1
		case c == 49:
			g.bg = 0
		case c == 38 || c == 48:
			col, used := extendedColour(codes[i+1:])
			i += used
			if col >= 0 && c == 38 {
				g.fg = col + 1
			} else if col >= 0 {
				g.bg = col + 1
			}
		}
	}
	return g
}

// extendedColour reads the colour after a 38 or 48 (5;N of the 256, or
// 2;R;G;B) as the nearest of the 16, and how many codes it used; -1 for
// none.
func extendedColour(codes []int) (colour, used int) {
	if len(codes) == 0 {
		return -1, 0
	}
	switch codes[0] {
	case 5:
		if len(codes) < 2 {
			return -1, len(codes)
		}
		n := codes[1]
		switch {
		case n < 16:
			return n, 2
		case n < 232:
			n -= 16
			level := [6]int{0, 95, 135, 175, 215, 255}
			return nearest16(level[n/36], level[n/6%6], level[n%6]), 2
		case n < 256:
			v := 8 + 10*(n-232)
			return nearest16(v, v, v), 2
		}
		return -1, 2
	case 2:
		if len(codes) < 4 {
			return -1, len(codes)
		}
		return nearest16(min(codes[1], 255), min(codes[2], 255), min(codes[3], 255)), 4
	}
	return -1, 1
}

// xterm16 is the RGB of the 16 colours, as xterm shows them.
var xterm16 = [16][3]int{{0, 0, 0}, {205, 0, 0}, {0, 205, 0}, {205, 205, 0}, {0, 0, 238}, {205, 0, 205}, {0, 205, 205}, {229, 229, 229},
	{127, 127, 127}, {255, 0, 0}, {0, 255, 0}, {255, 255, 0}, {92, 92, 255}, {255, 0, 255}, {0, 255, 255}, {255, 255, 255}}

// nearest16 reports which of the 16 colours is nearest r, g, b.
func nearest16(r, g, b int) int {
	best, bestD := 0, 1<<30
	for i, c := range xterm16 {
		if d := (c[0]-r)*(c[0]-r) + (c[1]-g)*(c[1]-g) + (c[2]-b)*(c[2]-b); d < bestD {
			best, bestD = i, d
		}
	}
	return best
}
