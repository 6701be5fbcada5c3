package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/dreamlake/lakeshore"
	"github.com/dreamlake/lakeshore/server/api"
)

func newTemplateCmd() *cobra.Command {
	var daemonAuth string
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Print the SAM template, or its IAM-mode variant (--daemon-auth iam)",
		Long: `Print template.yaml as built into this binary. With --daemon-auth iam, print
the variant whose daemon routes sit behind API Gateway's AWS_IAM authorizer
(the committed template-iam.yaml is this output: make template-iam.yaml):
every POST /v1/daemon/* route gets Auth: {Authorizer: AWS_IAM}, the HttpApi
enables the IAM authorizer, the wake channel's $connect route gets
AuthorizationType AWS_IAM, every function gets LAKESHORE_DAEMON_AUTH=iam,
and outputs name the route ARNs the fleet's instance role may invoke.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch daemonAuth {
			case "token":
				_, err := cmd.OutOrStdout().Write(lakeshore.Template)
				return err
			case "iam":
				return writeIAMTemplate(cmd.OutOrStdout(), lakeshore.Template)
			default:
				return fmt.Errorf("--daemon-auth must be token or iam, got %q", daemonAuth)
			}
		},
	}
	cmd.Flags().StringVar(&daemonAuth, "daemon-auth", "token", "token (template.yaml as it is) or iam")
	return cmd
}

// iamHeader opens the generated template.
const iamHeader = `# GENERATED from template.yaml by "lakeshore template --daemon-auth iam"
# (make template-iam.yaml); do not edit: a test keeps it in step.
#
# IAM mode (docs/security.md): the daemon routes sit behind API Gateway's
# AWS_IAM authorizer. nymph --iam signs with its instance role; the worker
# and enrollment tokens travel in X-Lakeshore-Token; every daemon call must
# come from the instance its machine_id names, and so must its wake socket.
# Deploy with
#   sam build -t template-iam.yaml && sam deploy -t .aws-sam/build/template.yaml --guided
# and allow the fleet's instance role execute-api:Invoke on the
# DaemonRoutesArn and WakeConnectArn outputs.
`

// writeIAMTemplate rewrites the SAM template src into its IAM-mode variant.
// It edits the YAML node tree, so comments, key order and the CloudFormation
// tags (!Ref, !Sub, !GetAtt) of template.yaml survive.
func writeIAMTemplate(w io.Writer, src []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return fmt.Errorf("parse template.yaml: %w", err)
	}
	root := doc.Content[0]
	root.HeadComment = ""

	vars := lookupPath(root, "Globals", "Function", "Environment", "Variables")
	if vars == nil {
		return fmt.Errorf("template.yaml: no Globals.Function.Environment.Variables")
	}
	setKey(vars, "LAKESHORE_DAEMON_AUTH", scalar("iam"))

	resources := lookupPath(root, "Resources")
	httpAPI := lookupPath(resources, "HttpApi", "Properties")
	if httpAPI == nil {
		return fmt.Errorf("template.yaml: no HttpApi resource")
	}
	setKey(httpAPI, "Auth", mapping("EnableIamAuthorizer", scalarTag("true", "!!bool")))

	routes := 0
	for i := 0; i+1 < len(resources.Content); i += 2 {
		events := lookupPath(resources.Content[i+1], "Properties", "Events")
		if events == nil {
			continue
		}
		for j := 0; j+1 < len(events.Content); j += 2 {
			ev := events.Content[j+1]
			props := lookupPath(ev, "Properties")
			typ, path := lookupPath(ev, "Type"), lookupPath(props, "Path")
			if typ == nil || typ.Value != "HttpApi" || path == nil || !strings.HasPrefix(path.Value, "/v1/daemon/") {
				continue
			}
			setKey(props, "Auth", mapping("Authorizer", scalar("AWS_IAM")))
			routes++
		}
	}
	if want := daemonRoutes(); routes != len(want) {
		return fmt.Errorf("template.yaml: %d daemon routes found, want %d (%s)", routes, len(want), strings.Join(want, ", "))
	}

	// The wake channel's $connect is a daemon route too: AWS_IAM, and the
	// wake function binds the socket to the calling instance.
	connect := lookupPath(resources, "WakeConnectRoute", "Properties")
	if connect == nil {
		return fmt.Errorf("template.yaml: no WakeConnectRoute")
	}
	iamAuth := scalar("AWS_IAM")
	iamAuth.LineComment = "# SigV4 of the instance role; the function checks the token and the instance"
	setKey(connect, "AuthorizationType", iamAuth)

	outputs := lookupPath(root, "Outputs")
	if outputs == nil {
		return fmt.Errorf("template.yaml: no Outputs")
	}
	arn := scalarTag("arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${HttpApi}/*/POST/v1/daemon/*", "!Sub")
	out := mapping("Description", scalar("Grant the fleet's instance role execute-api:Invoke on this (the daemon routes)."), "Value", arn)
	setKey(outputs, "DaemonRoutesArn", out)
	wakeARN := scalarTag("arn:${AWS::Partition}:execute-api:${AWS::Region}:${AWS::AccountId}:${WakeApi}/wake/$connect", "!Sub")
	out = mapping("Description", scalar("Grant the fleet's instance role execute-api:Invoke on this too (the wake channel's $connect)."), "Value", wakeARN)
	setKey(outputs, "WakeConnectArn", out)

	var buf bytes.Buffer
	buf.WriteString(iamHeader)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return fmt.Errorf("render the IAM template: %w", err)
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// lookupPath follows mapping keys from n; nil when one is missing.
func lookupPath(n *yaml.Node, keys ...string) *yaml.Node {
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
				break
			}
		}
		n = next
	}
	return n
}

// setKey sets key in mapping m to v, replacing an existing value.
func setKey(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, scalar(key), v)
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

func scalarTag(v, tag string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v}
}

// mapping builds a mapping node from key, value pairs.
func mapping(kv ...any) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		v, ok := kv[i+1].(*yaml.Node)
		if !ok {
			v = scalar(fmt.Sprint(kv[i+1]))
		}
		m.Content = append(m.Content, scalar(kv[i].(string)), v)
	}
	return m
}

// daemonRoutes lists the router's daemon routes ("POST /v1/daemon/hello", …).
func daemonRoutes() []string {
	var out []string
	for _, r := range api.Routes() {
		if strings.Contains(r, " /v1/daemon/") {
			out = append(out, r)
		}
	}
	return out
}
