package embedded

import (
	"encoding/json"
	"testing"
)

// FuzzQuery: any Query body, on a shadowed table with items, is answered
// from the shadow, refused, or left to minidyn, never a panic; an answer
// from the shadow is JSON.
func FuzzQuery(f *testing.F) {
	for _, q := range hotQueries {
		body, _ := json.Marshal(q)
		f.Add(body)
	}
	f.Add([]byte(`{"TableName":"cost","KeyConditionExpression":"pk = :h AND begins_with(sk, :p)","ExpressionAttributeValues":{":h":{"S":"hot"},":p":{"N":"1"}}}`))
	f.Add([]byte(`{"TableName":"cost","IndexName":"g","KeyConditionExpression":"(gh = :h) AND sk BETWEEN :a AND :b","ExclusiveStartKey":{"pk":{"S":"hot"},"sk":{"B":"AA=="},"gh":{"S":"hot"}},"ExpressionAttributeValues":{":h":{"S":"hot"},":a":{"S":"k"},":b":{"S":"a"}},"Limit":1}`))
	f.Add([]byte(`{"TableName":"cost","KeyConditionExpression":"pk = :h","FilterExpression":"size(body) >","ProjectionExpression":"body[0]","ExpressionAttributeValues":{":h":{"S":"hot"}},"Select":"COUNT"}`))
	_, e := costTable(f, 20)
	f.Fuzz(func(t *testing.T, body []byte) {
		var answer []byte
		e.locked(func() { answer, _, _ = e.query(body) })
		if answer != nil && !json.Valid(answer) {
			t.Fatalf("answer %q to %q is not JSON", answer, body)
		}
	})
}

// FuzzParseKeyCondition: any expression parses or is refused, never a
// panic, and a parse holds one or two conditions, each with its values.
func FuzzParseKeyCondition(f *testing.F) {
	for _, s := range []string{"pk = :h", "(:h = #p) AND begins_with(sk, :v)", "pk = :h AND sk BETWEEN :a AND :b", "((", "#", ":"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		conds, ok := parseKeyCondition(expr, map[string]string{"#p": "pk"})
		if !ok {
			return
		}
		if len(conds) == 0 || len(conds) > 2 {
			t.Fatalf("%q: %d conditions", expr, len(conds))
		}
		for _, c := range conds {
			if c.attr == "" || len(c.vals) == 0 {
				t.Fatalf("%q: condition %+v", expr, c)
			}
		}
	})
}
