package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// resultTestRead writes content to a result file and reads it back as the
// runner does.
func resultTestRead(t *testing.T, content string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), ResultFileName)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	blob, err := readResultFile(path)
	return string(blob), err
}

// resultTestLinesOfSize reports a JSON lines file of exactly size bytes (two
// lines, no trailing newline) whose array, once compact, is size+2 bytes: the
// newline becomes a comma, and the brackets are added.
func resultTestLinesOfSize(size int) string {
	// 1+(size-5)+1 bytes of string, a newline, 2 bytes of number.
	return `"` + strings.Repeat("a", size-5) + `"` + "\n" + `22`
}

func TestReadResultFileJSONLines(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ content, want string }{
		"three records":            {"{\"v\":1}\n{\"v\":2}\n{\"v\":3}\n", `[{"v":1},{"v":2},{"v":3}]`},
		"no trailing newline":      {"{\"v\":1}\n{\"v\":2}\n{\"v\":3}", `[{"v":1},{"v":2},{"v":3}]`},
		"blank lines are ignored":  {"\n{\"a\":1}\n\n  \t\n{\"b\":2}\n\n", `[{"a":1},{"b":2}]`},
		"CRLF":                     {"{\"a\":1}\r\n\r\n{\"b\":2}\r\n", `[{"a":1},{"b":2}]`},
		"records are compacted":    {"{ \"a\" : [1, 2] }\n [3,  4] \t\n", `[{"a":[1,2]},[3,4]]`},
		"records are HTML-escaped": {"{\"h\":\"<b>\"}\n\"&\"\n", `[{"h":"\u003cb\u003e"},"\u0026"]`},
		"any JSON values":          {"1\n\"s\"\nnull\ntrue\n[]\n", `[1,"s",null,true,[]]`},
		"array of exactly the limit": {
			resultTestLinesOfSize(wire.MaxResultBlobBytes - 2),
			`["` + strings.Repeat("a", wire.MaxResultBlobBytes-7) + `",22]`,
		},
	}
	resultTestBlobs(t, cases)
}

func TestReadResultFileOneValueStaysAsItIs(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ content, want string }{
		"object":                   {"{\"a\": 1}\n", `{"a":1}`},
		"array":                    {"[1, 2]\n", `[1,2]`},
		"array of objects":         {`[{"v":1},{"v":2}]`, `[{"v":1},{"v":2}]`},
		"string":                   {`"s"`, `"s"`},
		"number":                   {"42\n", `42`},
		"one line amid blank ones": {"\n\r\n{\"a\":1}\r\n\n", `{"a":1}`},
		"pretty-printed object":    {"{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}\n", `{"a":1,"b":[2]}`},
		"pretty-printed array":     {"[\n  1,\n  2\n]\n", `[1,2]`},
	}
	resultTestBlobs(t, cases)
}

// resultTestBlobs checks that each case's file content reads as its blob.
func resultTestBlobs(t *testing.T, cases map[string]struct{ content, want string }) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := resultTestRead(t, tc.content)
			if err != nil {
				t.Fatalf("readResultFile: %v", err)
			}
			if got != tc.want {
				t.Errorf("blob = %.80q, want %.80q", got, tc.want)
			}
		})
	}
}

func TestReadResultFileRefuses(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ content, wantMsg string }{
		"a line that is not JSON":         {"{\"v\":1}\n{\"v\":2}\nnot json\n{\"v\":4}\n", "line 3 is not a JSON value"},
		"lines counted across blank ones": {"\n\r\n{\"v\":1}\n{oops}\n", "line 4 is not a JSON value"},
		"an unfinished last line":         {"{\"v\":1}\n{\"v\":", "line 2 is not a JSON value"},
		"two values on one line":          {`{"a":1} {"b":2}`, "line 1 is not a JSON value"},
		"two values on a line of many":    {"{\"a\":1}\n{\"b\":2} 3\n{\"c\":4}\n", "line 2 is not a JSON value"},
		"a broken pretty-printed value":   {"{\n  \"a\": 1,\n}\n", "line 1 is not a JSON value"},
		// An empty file has no value: it fails as it does with no lines at all.
		"empty":           {"", "not valid JSON"},
		"only whitespace": {" \n\r\n\t\n", "not valid JSON"},
		"array over the limit once converted": {
			resultTestLinesOfSize(wire.MaxResultBlobBytes),
			"is 131074 bytes once compacted and escaped; the limit is 131072",
		},
		"array over the limit once escaped": {
			strings.Repeat("\"<\"\n", wire.MaxResultBlobBytes/8),
			"the limit is 131072",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := resultTestRead(t, tc.content)
			if err == nil {
				t.Fatalf("readResultFile = %.80q, want an error saying %q", got, tc.wantMsg)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error = %q, want it to say %q", err, tc.wantMsg)
			}
		})
	}
}
