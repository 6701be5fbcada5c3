package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestBidiControlsShownEscaped: a label and an argv holding a right-to-left
// override (U+202E) print it as \u202e in the tables and the text views,
// so it cannot reorder what the operator reads; --output json keeps the
// string as it is.
func TestBidiControlsShownEscaped(t *testing.T) {
	now := time.Now()
	label := "build-\u202egnp.exe"
	wk := wire.Worker{WorkerID: "wrk_1", Label: label, State: "active", MaxConcurrency: 1}
	inv := wire.Invocation{InvocationID: "inv_1", Queue: "q", State: wire.StateQueued, Argv: []string{"rm", "-rf", "\u202e/ cod"}}
	var text strings.Builder
	if err := workerTable(&text, []wire.Worker{wk}, now); err != nil {
		t.Fatal(err)
	}
	if err := describeWorker(&text, wk, now); err != nil {
		t.Fatal(err)
	}
	if err := describeInvocation(&text, inv, now); err != nil {
		t.Fatal(err)
	}
	got := text.String()
	if strings.ContainsRune(got, '\u202e') {
		t.Fatalf("the text output holds U+202E:\n%s", got)
	}
	for _, want := range []string{`build-\u202egnp.exe`, `rm -rf '\u202e/ cod'`} {
		if !strings.Contains(got, want) {
			t.Errorf("the text output lacks %s:\n%s", want, got)
		}
	}
	var js strings.Builder
	if err := printJSON(&js, wk); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"label": "`+label+`"`) {
		t.Errorf("--output json changed the label: %s", js.String())
	}
}
