package embedded

import (
	"strings"
)

// keyCond is one comparison of a KeyConditionExpression, its attribute
// name resolved and its value placeholders (":v") kept: attr op vals[0],
// attr BETWEEN vals[0] AND vals[1], or begins_with(attr, vals[0]).
type keyCond struct {
	attr string
	op   string // "=", "<", "<=", ">", ">=", "BETWEEN", "begins_with"
	vals []string
}

// parseKeyCondition reads the KeyConditionExpression shapes DynamoDB
// allows: a partition key equality, optionally AND one sort key condition,
// in either order, each operand order, with any parentheses. It reports
// false for anything else (an OR, a NOT, a function other than
// begins_with, an undeclared #name), which minidyn then answers.
func parseKeyCondition(expr string, names map[string]string) ([]keyCond, bool) {
	toks, ok := tokenize(expr)
	if !ok {
		return nil, false
	}
	p := &condParser{toks: toks, names: names}
	conds, ok := p.conj()
	if !ok || p.pos != len(p.toks) || len(conds) == 0 || len(conds) > 2 {
		return nil, false
	}
	return conds, true
}

type condParser struct {
	toks  []string
	pos   int
	names map[string]string
}

func (p *condParser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return ""
}

func (p *condParser) next() string {
	t := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return t
}

func (p *condParser) expect(t string) bool { return p.next() == t }

// conj := unit (AND unit)*
func (p *condParser) conj() ([]keyCond, bool) {
	var out []keyCond
	for {
		cs, ok := p.unit()
		if !ok {
			return nil, false
		}
		out = append(out, cs...)
		if !strings.EqualFold(p.peek(), "AND") {
			return out, true
		}
		p.next()
	}
}

// unit := ( conj ) | begins_with ( name , value ) | name BETWEEN value AND value | operand cmp operand
func (p *condParser) unit() ([]keyCond, bool) {
	switch t := p.peek(); {
	case t == "(":
		p.next()
		cs, ok := p.conj()
		if !ok || !p.expect(")") {
			return nil, false
		}
		return cs, true
	case t == "begins_with":
		p.next()
		if !p.expect("(") {
			return nil, false
		}
		attr, ok := p.name(p.next())
		if !ok || !p.expect(",") {
			return nil, false
		}
		v := p.next()
		if !isValue(v) || !p.expect(")") {
			return nil, false
		}
		return []keyCond{{attr: attr, op: "begins_with", vals: []string{v}}}, true
	}
	left := p.next()
	op := p.next()
	if strings.EqualFold(op, "BETWEEN") {
		attr, ok := p.name(left)
		lo := p.next()
		if !ok || !isValue(lo) || !strings.EqualFold(p.next(), "AND") {
			return nil, false
		}
		hi := p.next()
		if !isValue(hi) {
			return nil, false
		}
		return []keyCond{{attr: attr, op: "BETWEEN", vals: []string{lo, hi}}}, true
	}
	flipped := map[string]string{"=": "=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}[op]
	if flipped == "" {
		return nil, false
	}
	right := p.next()
	if isValue(left) {
		left, right, op = right, left, flipped
	}
	attr, ok := p.name(left)
	if !ok || !isValue(right) {
		return nil, false
	}
	return []keyCond{{attr: attr, op: op, vals: []string{right}}}, true
}

// name resolves an attribute operand: "#x" through ExpressionAttributeNames,
// a bare name as itself.
func (p *condParser) name(t string) (string, bool) {
	if strings.HasPrefix(t, "#") {
		n, ok := p.names[t]
		return n, ok && n != ""
	}
	if t == "" || !isWordStart(t[0]) || strings.EqualFold(t, "AND") || strings.EqualFold(t, "BETWEEN") || t == "begins_with" {
		return "", false
	}
	return t, true
}

func isValue(t string) bool { return len(t) > 1 && t[0] == ':' }

func isWordStart(c byte) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isWordByte(c byte) bool {
	return isWordStart(c) || ('0' <= c && c <= '9')
}

// tokenize splits an expression into words (names, #names, :values,
// keywords) and the punctuation of the shapes parseKeyCondition reads.
func tokenize(s string) ([]string, bool) {
	var toks []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == ',' || c == '=':
			toks = append(toks, s[i:i+1])
			i++
		case c == '<' || c == '>':
			if i+1 < len(s) && s[i+1] == '=' {
				toks = append(toks, s[i:i+2])
				i += 2
				continue
			}
			if c == '<' && i+1 < len(s) && s[i+1] == '>' {
				return nil, false
			}
			toks = append(toks, s[i:i+1])
			i++
		case c == '#' || c == ':' || isWordByte(c):
			j := i + 1
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			if (c == '#' || c == ':') && j == i+1 {
				return nil, false
			}
			toks = append(toks, s[i:j])
			i = j
		default:
			return nil, false
		}
	}
	return toks, true
}
