package lakeshore_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/awslabs/goformation/v7"

	"github.com/dreamlake/lakeshore"
	"github.com/dreamlake/lakeshore/shared/api"
)

// TestTemplateMatchesTheCode: template.yaml, functions/, the Makefile's
// build-<LogicalId> targets and the router agree: one SAM function per
// functions/<name> (BuildMethod makefile, a make target), and the HttpApi
// routes every route the router serves, no more.
func TestTemplateMatchesTheCode(t *testing.T) {
	tmpl, err := goformation.ParseYAML(lakeshore.Template)
	if err != nil {
		t.Fatalf("parse template.yaml: %v", err)
	}
	makefile, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := os.ReadDir("functions")
	if err != nil {
		t.Fatal(err)
	}
	fns := tmpl.GetAllServerlessFunctionResources()
	logical := map[string]string{"hello": "HelloFunction", "poll": "PollFunction", "ack": "AckFunction", "bye": "ByeFunction",
		"api": "ApiFunction", "reaper": "ReaperFunction", "hoststatus": "HostStatusFunction"}
	for _, d := range dirs {
		id, ok := logical[d.Name()]
		if !ok {
			t.Errorf("functions/%s has no logical id in this test; add it", d.Name())
			continue
		}
		fn, ok := fns[id]
		if !ok {
			t.Errorf("functions/%s: no %s in template.yaml", d.Name(), id)
			continue
		}
		if fn.AWSCloudFormationMetadata["BuildMethod"] != "makefile" {
			t.Errorf("%s: Metadata.BuildMethod is %v, want makefile", id, fn.AWSCloudFormationMetadata["BuildMethod"])
		}
		if !strings.Contains(string(makefile), d.Name()+":"+id) {
			t.Errorf("Makefile SAM_FUNCTIONS lacks %s:%s (the build-%s target)", d.Name(), id, id)
		}
	}
	if len(fns) != len(dirs) {
		t.Errorf("template.yaml has %d functions, functions/ has %d", len(fns), len(dirs))
	}

	var routed []string
	for _, fn := range fns {
		for _, ev := range fn.Events {
			if ev.Type != "HttpApi" || ev.Properties == nil || ev.Properties.HttpApiEvent == nil {
				continue
			}
			e := ev.Properties.HttpApiEvent
			routed = append(routed, *e.Method+" "+*e.Path)
		}
	}
	slices.Sort(routed)
	if want := api.Routes(); !slices.Equal(routed, want) {
		t.Errorf("HttpApi routes in template.yaml:\n  %v\nthe router serves:\n  %v", routed, want)
	}
}
