package store

import (
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestDecodeCursorRefusesForeignCursors: a cursor is only accepted by the
// listing that returned it. A forged or reused one would reach DynamoDB as a
// bad ExclusiveStartKey, a ValidationException (500) on AWS.
func TestDecodeCursorRefusesForeignCursors(t *testing.T) {
	queueCursor := encodeCursor(map[string]types.AttributeValue{"queue": str("a"), "invocation_id": str("inv_1")})
	scanCursor := encodeCursor(map[string]types.AttributeValue{"invocation_id": str("inv_1")})
	cases := []struct {
		name   string
		cursor string
		fixed  map[string]string
		keys   []string
		ok     bool
	}{
		{"empty means first page", "", nil, []string{"invocation_id"}, true},
		{"own cursor", queueCursor, map[string]string{"queue": "a"}, []string{"queue", "invocation_id"}, true},
		{"queue cursor on another queue", queueCursor, map[string]string{"queue": "b"}, []string{"queue", "invocation_id"}, false},
		{"queue cursor on a scan", queueCursor, nil, []string{"invocation_id"}, false},
		{"scan cursor on a queue", scanCursor, map[string]string{"queue": "a"}, []string{"queue", "invocation_id"}, false},
		{"made-up keys", encodeCursor(map[string]types.AttributeValue{"foo": str("bar")}), nil, []string{"invocation_id"}, false},
		{"not base64", "!!!", nil, []string{"invocation_id"}, false},
		{"not JSON", "bm90IGpzb24", nil, []string{"invocation_id"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decodeCursor(c.cursor, c.fixed, c.keys...)
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && !errors.Is(err, wire.ErrInvalid) {
				t.Fatalf("err = %v, want invalid", err)
			}
		})
	}
}
