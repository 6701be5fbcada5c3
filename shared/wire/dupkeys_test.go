package wire

import (
	"reflect"
	"strings"
	"testing"
)

func TestDuplicateKey(t *testing.T) {
	submit := reflect.TypeFor[*SubmitRequest]()
	ack := reflect.TypeFor[*AckRequest]()
	hello := reflect.TypeFor[*HelloRequest]()
	for _, tc := range []struct {
		name, body string
		typ        reflect.Type
		want       string
	}{
		{"distinct", `{"queue":"q","argv":["a"]}`, submit, ""},
		{"exact repeat", `{"queue":"q","queue":"r"}`, submit, "queue"},
		{"repeat in another case", `{"queue":"q","QUEUE":"r"}`, submit, "QUEUE"},
		{"Kelvin sign folds to k", "{\"idempotency_key\":\"a\",\"idempotency_\u212aey\":\"b\"}", submit, "idempotency_\u212aey"},
		{"nested struct", `{"run_config":{"workdir":"a","Workdir":"b"}}`, submit, "Workdir"},
		{"env keys are case-sensitive", `{"env":{"PATH":"1","path":"2"}}`, submit, ""},
		{"env exact repeat", `{"env":{"X":"1","X":"2"}}`, submit, "X"},
		{"run_config env", `{"run_config":{"env":{"A":"1","a":"2","A":"3"}}}`, submit, "A"},
		{"tags case-sensitive", `{"tags":{"k":"1","K":"2"}}`, hello, ""},
		{"capabilities struct", `{"capabilities":{"max_concurrency":1,"MAX_CONCURRENCY":2}}`, hello, "MAX_CONCURRENCY"},
		{"result_blob is free JSON", `{"result_blob":{"a":1,"A":2}}`, ack, ""},
		{"result_blob exact repeat", `{"result_blob":{"a":{"b":1,"b":2}}}`, ack, "b"},
		{"sibling objects", `{"result_blob":[{"b":1},{"b":2}]}`, ack, ""},
		{"after a nested value", `{"error":{"type":"x"},"state":"failed","error":null}`, ack, "error"},
		{"array at top", `[{"a":1},{"a":1}]`, submit, ""},
		{"scalar at top", `"a"`, submit, ""},
		{"truncated", `{"queue":"q",`, submit, ""},
		{"not JSON", `not json`, submit, ""},
	} {
		if got := duplicateKey([]byte(tc.body), tc.typ); got != tc.want {
			t.Errorf("%s: duplicateKey(%s) = %q, want %q", tc.name, tc.body, got, tc.want)
		}
	}
}

// TestDecodeRefusesDuplicateKeys: a repeated field is a 400 that names it,
// whatever its case.
func TestDecodeRefusesDuplicateKeys(t *testing.T) {
	var r ByeRequest
	err := Decode(strings.NewReader(`{"worker_id":"wrk_01M8MZ5PHEDXEHYP5EKED7265H","reason":"idle","Reason":"signal"}`), &r)
	if CodeOf(err) != CodeInvalid || !strings.Contains(err.Error(), `"Reason"`) {
		t.Fatalf("duplicate reason: %v", err)
	}
}
