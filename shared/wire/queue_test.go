package wire

import "testing"

// TestValidQueueRefusesDotNames: "." and ".." pass a plain character class
// but are eaten as path segments in GET /v1/queues/{queue}, so such a queue
// could be submitted to and never read back.
func TestValidQueueRefusesDotNames(t *testing.T) {
	cases := map[string]bool{
		"default": true, "gpu.a100": true, "a": true, "0": true, "a-b_c.d": true,
		".": false, "..": false, "...": false, ".hidden": false, "-x": false, "_x": false, "": false,
		"a/b": false, "a b": false,
	}
	for q, want := range cases {
		if got := ValidQueue(q); got != want {
			t.Errorf("ValidQueue(%q) = %v, want %v", q, got, want)
		}
	}
	long := make([]byte, MaxQueueLen+1)
	for i := range long {
		long[i] = 'q'
	}
	if ValidQueue(string(long)) || !ValidQueue(string(long[:MaxQueueLen])) {
		t.Error("queue length limit is not 64")
	}
}
