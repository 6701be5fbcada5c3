package embedded

import (
	"reflect"
	"testing"

	"github.com/truora/minidyn/server"
)

func TestParseKeyCondition(t *testing.T) {
	names := map[string]string{"#p": "pk", "#s": "sk"}
	for _, tc := range []struct {
		name, expr string
		want       []keyCond // nil: not handled, minidyn answers
	}{
		{"equality", "pk = :h", []keyCond{{"pk", "=", []string{":h"}}}},
		{"alias", "#p = :h", []keyCond{{"pk", "=", []string{":h"}}}},
		{"value first", ":h = #p", []keyCond{{"pk", "=", []string{":h"}}}},
		{"sort less", "pk = :h AND sk < :v", []keyCond{{"pk", "=", []string{":h"}}, {"sk", "<", []string{":v"}}}},
		{"sort flipped", "pk = :h and :v < #s", []keyCond{{"pk", "=", []string{":h"}}, {"sk", ">", []string{":v"}}}},
		{"flipped >=", ":v >= sk AND pk = :h", []keyCond{{"sk", "<=", []string{":v"}}, {"pk", "=", []string{":h"}}}},
		{"between", "pk = :h AND sk BETWEEN :a AND :b", []keyCond{{"pk", "=", []string{":h"}}, {"sk", "BETWEEN", []string{":a", ":b"}}}},
		{"begins_with", "(pk = :h) AND (begins_with(#s, :p))", []keyCond{{"pk", "=", []string{":h"}}, {"sk", "begins_with", []string{":p"}}}},
		{"outer parentheses", "((pk = :h AND sk >= :v))", []keyCond{{"pk", "=", []string{":h"}}, {"sk", ">=", []string{":v"}}}},
		{"or", "pk = :h OR sk = :v", nil},
		{"not equal", "pk <> :h", nil},
		{"undeclared alias", "#x = :h", nil},
		{"two values", ":a = :b", nil},
		{"three conditions", "pk = :h AND sk > :a AND sk < :b", nil},
		{"other function", "pk = :h AND contains(sk, :v)", nil},
		{"unbalanced", "(pk = :h", nil},
		{"empty", "", nil},
		{"trailing", "pk = :h AND", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseKeyCondition(tc.expr, names)
			if ok != (tc.want != nil) || (ok && !reflect.DeepEqual(got, tc.want)) {
				t.Errorf("parseKeyCondition(%q) = %v, %v; want %v", tc.expr, got, ok, tc.want)
			}
		})
	}
}

// TestKeyOrder: sort keys order as DynamoDB orders them: N by value (not
// as strings: 9 before 10, negatives first, exponents read), S and B by
// their bytes.
func TestKeyOrder(t *testing.T) {
	num := func(v string) keyValue {
		k, ok := keyValueOf(&server.AttributeValue{N: &v}, "N")
		if !ok {
			t.Fatalf("N %q not read", v)
		}
		return k
	}
	str := func(v string) keyValue {
		k, _ := keyValueOf(&server.AttributeValue{S: &v}, "S")
		return k
	}
	bin := func(v ...byte) keyValue {
		k, _ := keyValueOf(&server.AttributeValue{B: v}, "B")
		return k
	}
	for _, tc := range []struct {
		a, b keyValue
		want int
	}{
		{num("9"), num("10"), -1},
		{num("-10"), num("-9"), -1},
		{num("-0.5"), num("0"), -1},
		{num("1e2"), num("100"), 0},
		{num("1.50"), num("1.5"), 0},
		{num("12345678901234567890123456789012345678"), num("12345678901234567890123456789012345679"), -1},
		{str("B"), str("a"), -1},
		{str("a"), str("ab"), -1},
		{str("é"), str("z"), 1},
		{bin(0x01), bin(0xff), -1},
		{bin(0x01), bin(0x01, 0x00), -1},
	} {
		if got := tc.a.compare(tc.b); got != tc.want {
			t.Errorf("compare(%q, %q) = %d, want %d", tc.a.raw, tc.b.raw, got, tc.want)
		}
	}
	if num("1").id() == num("1.0").id() {
		t.Error(`N "1" and "1.0" name one item; minidyn keeps them apart`)
	}
	if _, ok := keyValueOf(&server.AttributeValue{N: new("x")}, "N"); ok {
		t.Error(`N "x" read as a number`)
	}
}
