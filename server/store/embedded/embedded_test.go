package embedded_test

import (
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/store/embedded"
)

// TestAnswersCarryCRC32: like DynamoDB, every answer carries X-Amz-Crc32
// of its body, which the SDK checks (without it the SDK logged a checksum
// warning on every call).
func TestAnswersCarryCRC32(t *testing.T) {
	srv := httptest.NewServer(embedded.Handler())
	defer srv.Close()
	for _, target := range []string{"ListTables", "NoSuchOperation"} {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
		req.Header.Set("X-Amz-Target", "DynamoDB_20120810."+target)
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10)
		if got := resp.Header.Get("X-Amz-Crc32"); got != want {
			t.Errorf("%s: X-Amz-Crc32 %q, want %q (body %q)", target, got, want, body)
		}
	}
}
