package wire_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// fuzzRequests are the request bodies wire.Decode reads, picked by the
// first argument of FuzzDecode (modulo their number).
var fuzzRequests = []func() wire.Validator{
	func() wire.Validator { return &wire.HelloRequest{} },
	func() wire.Validator { return &wire.PollRequest{} },
	func() wire.Validator { return &wire.AckRequest{} },
	func() wire.Validator { return &wire.ByeRequest{} },
	func() wire.Validator { return &wire.SubmitRequest{} },
	func() wire.Validator { return &wire.SetupRequest{} },
}

// Selectors of FuzzDecode, in fuzzRequests order.
const (
	kindHello uint8 = iota
	kindPoll
	kindAck
	kindBye
	kindSubmit
	kindSetup
)

// FuzzDecode decodes any body into each request type. A refusal must be a
// *wire.Error with a 4xx status (413 exactly when the body is over the
// limit). An accepted value must encode (json.Marshal, what the Go client
// sends) to a body that decodes and validates again to an equal value, and
// whose encoding is the same again.
func FuzzDecode(f *testing.F) {
	hk := "hk1_" + strings.Repeat("0123456789abcdef", 4)
	for _, seed := range []struct {
		kind uint8
		body string
	}{
		{kindHello, `{"machine_id":"m-1","boot_id":"b-1"}`},
		{kindHello, `{"machine_id":"m-1","boot_id":"b-1","label":"gpu box","tags":{"zone":"a"},"lanes":["default","gpu"],"capabilities":{"max_concurrency":4,"current_invocations":0},"versions":{"nymph":"1.2.3"},"host_key":"` + hk + `"}`},
		{kindHello, `{"machine_id":"m","boot_id":"b","tags":{},"lanes":[],"versions":{},"capabilities":{}}`},
		{kindHello, `{"machine_id":"m","boot_id":"b","lanes":["a b"]}`},
		{kindPoll, `{"worker_id":"` + workerID + `"}`},
		{kindPoll, `{"worker_id":"` + workerID + `","invocations":[]}`},
		{kindPoll, `{"worker_id":"` + workerID + `","queue":"default","timeout_s":2.5,"invocations":["` + invID + `"],"phase":"ready","host_key":"` + hk + `","updated_capabilities":{"current_invocations":1,"max_concurrency":2},"setup_results":[{"command_id":"` + commandID + `","status":"failed","exit_code":2,"duration_ms":1500,"output_tail":"boom"}]}`},
		{kindPoll, `{"worker_id":"` + workerID + `","timeout_s":-0,"updated_capabilities":null,"setup_results":[]}`},
		{kindPoll, `{"worker_id":"` + workerID + `","timeout_s":1e400}`},
		{kindAck, `{"worker_id":"` + workerID + `","invocation_id":"` + invID + `","attempt":1,"state":"succeeded","exit_code":0}`},
		{kindAck, `{"worker_id":"` + workerID + `","invocation_id":"` + invID + `","attempt":2,"state":"failed","exit_code":1,"result_blob":{ "a" : [1, 2.5e3, "<&>"] },"error":{"type":"oom","message":"killed"},"stdout_tail":"out\u2028","stderr_tail":"err"}`},
		{kindAck, `{"worker_id":"` + workerID + `","invocation_id":"` + invID + `","attempt":1,"state":"cancelled","result_blob":null,"error":null}`},
		{kindBye, `{"worker_id":"` + workerID + `","reason":"idle"}`},
		{kindBye, `{"worker_id":"` + workerID + `","reason":"spot_interruption","inflight_abandoned":3}`},
		{kindSubmit, `{"queue":"default","argv":["echo","hi"]}`},
		{kindSubmit, `{"queue":"gpu","argv":["python","train.py"],"env":{"SEED":"1"},"run_config":{"host_setup":["apt-get install -y jq"],"run_setup":["cd /srv"],"env":{"A":"b"},"workdir":"/srv"},"timeout_s":3600,"max_attempts":5,"idempotency_key":"k-1"}`},
		{kindSubmit, `{"queue":"default","argv":["x"],"env":{},"run_config":{"host_setup":[],"env":{}},"max_attempts":0}`},
		{kindSubmit, `{"queue":"default","argv":["a\u0000b"]}`},
		{kindSetup, `{"argv":["true"]}`},
		{kindSetup, `{"argv":[""]}`},
		{kindSetup, `{"argv":["true"]} {}`},
		{kindSetup, `{"argv":["tr` + "\xff" + `ue"]}`},
		{kindSetup, ``},
		{kindSetup, `null`},
	} {
		f.Add(seed.kind, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		newReq := fuzzRequests[int(kind)%len(fuzzRequests)]
		v := newReq()
		err := wire.Decode(bytes.NewReader(body), v)
		if err != nil {
			we, ok := err.(*wire.Error)
			if !ok {
				t.Fatalf("Decode(%T) refused with %T %v, want a *wire.Error", v, err, err)
			}
			if status := wire.Status(wire.CodeOf(err)); status < 400 || status > 499 {
				t.Fatalf("Decode(%T) refused with status %d: %v", v, status, err)
			}
			if we.Message == "" {
				t.Errorf("Decode(%T) refused without a message: %v", v, err)
			}
			if tooLarge := len(body) > wire.MaxBodyBytes; tooLarge != (we.Code == wire.CodeTooLarge) {
				t.Errorf("Decode(%T) of %d bytes refused with %v", v, len(body), err)
			}
			return
		}
		if len(body) > wire.MaxBodyBytes {
			t.Fatalf("Decode(%T) accepted %d bytes", v, len(body))
		}

		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("accepted %T does not encode: %v", v, err)
		}
		again := newReq()
		if len(enc) <= wire.MaxBodyBytes {
			err = wire.Decode(bytes.NewReader(enc), again)
		} else {
			// json.Marshal escapes <, >, & and U+2028/9 six bytes wide, so a
			// body near the limit may not fit once re-encoded; the value
			// must still decode and validate.
			if err = json.Unmarshal(enc, again); err == nil {
				err = again.Validate()
			}
		}
		if err != nil {
			t.Fatalf("accepted %T re-encodes to %s, which is refused: %v", v, clip(enc), err)
		}
		if d := wireDiff("", reflect.ValueOf(v), reflect.ValueOf(again), false); d != "" {
			t.Fatalf("%T round trip changed the value: %s\nencoded: %s", v, d, clip(enc))
		}
		if enc2, err := json.Marshal(again); err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("%T encodes to %s, then to %s (%v)", v, clip(enc), clip(enc2), err)
		}
		if err := v.Validate(); err != nil {
			t.Fatalf("accepted %T no longer validates: %v", v, err)
		}
	})
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// wireDiff reports how two decoded values differ, or "", ignoring what the
// JSON encoding cannot carry: an empty map or slice in an omitempty field is
// omitted and comes back nil, and a json.RawMessage is sent compact and
// HTML-escaped. (An omitzero field such as PollRequest.Invocations keeps
// empty apart from nil, and so must the round trip.)
func wireDiff(path string, a, b reflect.Value, omitEmpty bool) string {
	if a.Type() == rawMessageType {
		if !bytes.Equal(canonicalJSON(a.Bytes()), canonicalJSON(b.Bytes())) {
			return fmt.Sprintf("%s: %s became %s", path, clip(a.Bytes()), clip(b.Bytes()))
		}
		return ""
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return fmt.Sprintf("%s: nil %v became nil %v", path, a.IsNil(), b.IsNil())
			}
			return ""
		}
		return wireDiff(path, a.Elem(), b.Elem(), false)
	case reflect.Struct:
		for i := range a.NumField() {
			f := a.Type().Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" {
				name = f.Name
			}
			if d := wireDiff(path+"."+name, a.Field(i), b.Field(i), strings.Contains(opts, "omitempty")); d != "" {
				return d
			}
		}
		return ""
	case reflect.Slice, reflect.Map:
		if a.Len() == 0 && b.Len() == 0 && (omitEmpty || a.IsNil() == b.IsNil()) {
			return ""
		}
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return fmt.Sprintf("%s: %#v became %#v", path, a.Interface(), b.Interface())
		}
		if a.Kind() == reflect.Slice {
			for i := range a.Len() {
				if d := wireDiff(fmt.Sprintf("%s[%d]", path, i), a.Index(i), b.Index(i), false); d != "" {
					return d
				}
			}
			return ""
		}
		for it := a.MapRange(); it.Next(); {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() {
				return fmt.Sprintf("%s: key %q lost", path, it.Key())
			}
			if d := wireDiff(fmt.Sprintf("%s[%q]", path, it.Key()), it.Value(), bv, false); d != "" {
				return d
			}
		}
		return ""
	default:
		if !a.Equal(b) {
			return fmt.Sprintf("%s: %#v became %#v", path, a.Interface(), b.Interface())
		}
		return ""
	}
}

// canonicalJSON is the form json.Marshal gives a json.RawMessage.
func canonicalJSON(raw []byte) []byte {
	var compact, escaped bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return raw
	}
	json.HTMLEscape(&escaped, compact.Bytes())
	return escaped.Bytes()
}

// clip shortens a body quoted in a failure message.
func clip(b []byte) string {
	if len(b) <= 256 {
		return string(b)
	}
	return string(b[:256]) + "…"
}
