package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/dreamlake/lakeshore"
)

// TestIAMTemplateInStep: the committed template-iam.yaml is exactly what
// `lakeshore template --daemon-auth iam` makes of template.yaml (run
// `make template-iam.yaml` after editing template.yaml).
func TestIAMTemplateInStep(t *testing.T) {
	var out bytes.Buffer
	if err := writeIAMTemplate(&out, lakeshore.Template); err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../../template-iam.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, out.Bytes()) {
		t.Fatal("template-iam.yaml is stale: run make template-iam.yaml")
	}
}

// TestIAMTemplate: the IAM variant puts exactly the daemon routes
// behind AWS_IAM, keeps the operator routes as they are, and tells every
// function it runs in IAM mode. (Read as YAML: goformation does not know
// EnableIamAuthorizer; cfn-lint checks the whole template in make lint.)
func TestIAMTemplate(t *testing.T) {
	var out bytes.Buffer
	if err := writeIAMTemplate(&out, lakeshore.Template); err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("parse the IAM template: %v", err)
	}
	root := doc.Content[0]
	resources := lookupPath(root, "Resources")
	iam, open := 0, 0
	for i := 0; i+1 < len(resources.Content); i += 2 {
		events := lookupPath(resources.Content[i+1], "Properties", "Events")
		for j := 0; events != nil && j+1 < len(events.Content); j += 2 {
			ev := events.Content[j+1]
			if lookupPath(ev, "Type").Value != "HttpApi" {
				continue
			}
			path := lookupPath(ev, "Properties", "Path").Value
			authorizer := ""
			if a := lookupPath(ev, "Properties", "Auth", "Authorizer"); a != nil {
				authorizer = a.Value
			}
			switch daemon := strings.HasPrefix(path, "/v1/daemon/"); {
			case daemon && authorizer == "AWS_IAM":
				iam++
			case !daemon && authorizer == "":
				open++
			default:
				t.Errorf("%s: authorizer %q", path, authorizer)
			}
		}
	}
	if want := len(daemonRoutes()); iam != want || want < 5 || open == 0 {
		t.Errorf("%d daemon routes behind AWS_IAM (want the router's %d), %d operator routes left to the router", iam, want, open)
	}
	if v := lookupPath(root, "Globals", "Function", "Environment", "Variables", "LAKESHORE_DAEMON_AUTH"); v == nil || v.Value != "iam" {
		t.Error("the functions are not told LAKESHORE_DAEMON_AUTH=iam")
	}
	if v := lookupPath(resources, "HttpApi", "Properties", "Auth", "EnableIamAuthorizer"); v == nil || v.Value != "true" {
		t.Error("the HttpApi does not enable the IAM authorizer")
	}
	if v := lookupPath(resources, "WakeConnectRoute", "Properties", "AuthorizationType"); v == nil || v.Value != "AWS_IAM" {
		t.Error("the wake channel's $connect is not behind AWS_IAM")
	}
	if v := lookupPath(root, "Outputs", "WakeConnectArn", "Value"); v == nil || !strings.HasSuffix(v.Value, "${WakeApi}/wake/$connect") {
		t.Error("no WakeConnectArn output for the instance role's policy")
	}
	// The token template leaves $connect to the function's token check.
	var plain yaml.Node
	if err := yaml.Unmarshal(lakeshore.Template, &plain); err != nil {
		t.Fatal(err)
	}
	if v := lookupPath(plain.Content[0], "Resources", "WakeConnectRoute", "Properties", "AuthorizationType"); v == nil || v.Value != "NONE" {
		t.Error("template.yaml's $connect is not AuthorizationType NONE")
	}
}
