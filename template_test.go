package lakeshore_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/awslabs/goformation/v7"
	"gopkg.in/yaml.v3"

	"github.com/dreamlake/lakeshore"
	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/blobs"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/shared/domain"
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
		"api": "ApiFunction", "reaper": "ReaperFunction", "hoststatus": "HostStatusFunction",
		"wake": "WakeFunction", "provisioner": "ProvisionerFunction"}
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
	if want := api.GatewayRoutes(); !slices.Equal(routed, want) {
		t.Errorf("HttpApi routes in template.yaml:\n  %v\nthe router serves:\n  %v", routed, want)
	}
}

// TestDaemonFunctionsServeTheirRoutes: every HttpApi route template.yaml
// sends to hello, poll, ack or bye is a route of the daemon routes' router,
// the only one those functions build (apilambda.Daemon); a route given to
// them that it lacks would answer 404 on AWS alone.
func TestDaemonFunctionsServeTheirRoutes(t *testing.T) {
	tmpl, err := goformation.ParseYAML(lakeshore.Template)
	if err != nil {
		t.Fatalf("parse template.yaml: %v", err)
	}
	fns := tmpl.GetAllServerlessFunctionResources()
	served := daemonapi.Routes()
	for _, id := range []string{"HelloFunction", "PollFunction", "AckFunction", "ByeFunction"} {
		fn, ok := fns[id]
		if !ok {
			t.Fatalf("no %s in template.yaml", id)
		}
		routes := 0
		for _, ev := range fn.Events {
			if ev.Type != "HttpApi" || ev.Properties == nil || ev.Properties.HttpApiEvent == nil {
				continue
			}
			routes++
			if r := *ev.Properties.HttpApiEvent.Method + " " + *ev.Properties.HttpApiEvent.Path; !slices.Contains(served, r) {
				t.Errorf("%s is routed %s, which the daemon routes' router (%v) does not serve", id, r, served)
			}
		}
		if routes == 0 {
			t.Errorf("%s has no HttpApi route", id)
		}
	}
}

// TestWakeChannelRoutes: the WebSocket API routes exactly what
// server/wake/wakelambda serves, each to the integration that invokes
// WakeFunction, and the keep-alive route sends its answer back. (It reads
// the YAML itself: goformation resolves !Sub away.)
func TestWakeChannelRoutes(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(lakeshore.Template, &doc); err != nil {
		t.Fatal(err)
	}
	resources := mapping(doc.Content[0], "Resources")
	if resources == nil {
		t.Fatal("template.yaml has no Resources")
	}
	var keys []string
	for i := 0; i+1 < len(resources.Content); i += 2 {
		id, res := resources.Content[i].Value, resources.Content[i+1]
		if typ := mapping(res, "Type"); typ == nil || typ.Value != "AWS::ApiGatewayV2::Route" {
			continue
		}
		props := mapping(res, "Properties")
		key := mapping(props, "RouteKey").Value
		keys = append(keys, key)
		if target := mapping(props, "Target"); target == nil || target.Value != "integrations/${WakeIntegration}" {
			t.Errorf("%s: target is not integrations/${WakeIntegration}", id)
		}
		if sel := mapping(props, "RouteResponseSelectionExpression"); key == "$default" && (sel == nil || sel.Value != "$default") {
			t.Errorf("%s: the keep-alive route needs RouteResponseSelectionExpression $default, or its pong never reaches the daemon", id)
		}
	}
	slices.Sort(keys)
	if want := []string{"$connect", "$default", "$disconnect"}; !slices.Equal(keys, want) {
		t.Errorf("WebSocket routes %v, want %v", keys, want)
	}
	uri := mapping(mapping(mapping(resources, "WakeIntegration"), "Properties"), "IntegrationUri")
	if uri == nil || !strings.Contains(uri.Value, "${WakeFunction.Arn}") {
		t.Errorf("WakeIntegration does not invoke WakeFunction")
	}
}

// mapping returns the value of key in YAML mapping node n, or nil.
func mapping(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// TestTemplateProductionGuards: what keeps a deployed control plane's data,
// caps its cost and pages someone (docs/operations.md) is in template.yaml,
// so a later edit cannot drop it unnoticed: every table retained on stack
// delete and replacement, deletion-protected, with point-in-time recovery
// and the optional customer-managed key; the API throttled, hello tighter;
// the daemon-facing functions' concurrency reserved and capped; every
// function's log group made with a retention before it runs; the alarms.
func TestTemplateProductionGuards(t *testing.T) {
	tmpl, err := goformation.ParseYAML(lakeshore.Template)
	if err != nil {
		t.Fatalf("parse template.yaml: %v", err)
	}
	tables := tmpl.GetAllDynamoDBTableResources()
	if len(tables) != 9 {
		t.Errorf("%d tables; this test knows 9 — check the new one's guards and update it", len(tables))
	}
	for id, tb := range tables {
		if tb.AWSCloudFormationDeletionPolicy != "Retain" || tb.AWSCloudFormationUpdateReplacePolicy != "Retain" {
			t.Errorf("%s: DeletionPolicy %q, UpdateReplacePolicy %q; want Retain, Retain", id, tb.AWSCloudFormationDeletionPolicy, tb.AWSCloudFormationUpdateReplacePolicy)
		}
		if tb.DeletionProtectionEnabled == nil || !*tb.DeletionProtectionEnabled {
			t.Errorf("%s: no DeletionProtectionEnabled", id)
		}
		if p := tb.PointInTimeRecoverySpecification; p == nil || p.PointInTimeRecoveryEnabled == nil || !*p.PointInTimeRecoveryEnabled {
			t.Errorf("%s: no point-in-time recovery", id)
		}
	}
	// What is an !If is read from the source.
	var doc struct {
		Parameters map[string]any `yaml:"Parameters"`
		Resources  map[string]struct {
			Type       string               `yaml:"Type"`
			Properties map[string]yaml.Node `yaml:"Properties"`
		} `yaml:"Resources"`
	}
	if err := yaml.Unmarshal(lakeshore.Template, &doc); err != nil {
		t.Fatal(err)
	}
	for id, r := range doc.Resources {
		if r.Type != "AWS::DynamoDB::Table" {
			continue
		}
		sse := r.Properties["SSESpecification"]
		if sse.Tag != "!If" || len(sse.Content) != 3 || sse.Content[0].Value != "UseTableKey" {
			t.Errorf("%s: SSESpecification is not !If [UseTableKey, …]", id)
		}
	}
	// Token rotation: the previous tokens' parameters reach every route
	// function.
	routeFns := 0
	for id, fn := range tmpl.GetAllServerlessFunctionResources() {
		if fn.Environment == nil {
			continue
		}
		if _, ok := fn.Environment.Variables["LAKESHORE_ENROLL_TOKEN_PARAM"]; !ok {
			continue // not a route function
		}
		routeFns++
		for _, v := range []string{"LAKESHORE_PREVIOUS_ENROLL_TOKEN_PARAM", "LAKESHORE_PREVIOUS_OPERATOR_TOKEN_PARAM"} {
			if _, ok := fn.Environment.Variables[v]; !ok {
				t.Errorf("%s: no %s (token rotation)", id, v)
			}
		}
	}
	if routeFns != 5 {
		t.Errorf("%d route functions read the token parameters, want 5 (hello, poll, ack, bye, api)", routeFns)
	}
	for _, p := range []string{"PreviousEnrollTokenParameter", "PreviousOperatorTokenParameter", "TableKmsKeyArn", "ApiRateLimit", "ApiBurstLimit", "HelloRateLimit", "HelloBurstLimit",
		"DaemonReservedConcurrency", "LogRetentionDays", "AlarmTopicArn", "OldestQueuedAlarmSeconds", "RedeliveriesAlarmPerMinute"} {
		if _, ok := doc.Parameters[p]; !ok {
			t.Errorf("no parameter %s", p)
		}
	}

	api, ok := tmpl.GetAllServerlessHttpApiResources()["HttpApi"]
	if !ok || api.DefaultRouteSettings == nil || api.DefaultRouteSettings.ThrottlingRateLimit == nil || api.DefaultRouteSettings.ThrottlingBurstLimit == nil {
		t.Errorf("HttpApi has no default throttling")
	}
	fns := tmpl.GetAllServerlessFunctionResources()
	hello := fns["HelloFunction"].Events["Hello"].Properties.HttpApiEvent
	if hello == nil || hello.RouteSettings == nil || hello.RouteSettings.ThrottlingRateLimit == nil {
		t.Errorf("hello has no throttling of its own")
	}
	logGroups := tmpl.GetAllLogsLogGroupResources()
	for id, fn := range fns {
		short := strings.TrimSuffix(id, "Function")
		daemon := slices.Contains([]string{"Hello", "Poll", "Ack", "Bye"}, short)
		if rc := doc.Resources[id].Properties["ReservedConcurrentExecutions"]; daemon &&
			(rc.Tag != "!If" || len(rc.Content) != 3 || rc.Content[0].Value != "CapDaemonConcurrency" || rc.Content[1].Value != "DaemonReservedConcurrency") {
			t.Errorf("%s: ReservedConcurrentExecutions is not !If [CapDaemonConcurrency, DaemonReservedConcurrency, …]", id)
		}
		lg, ok := logGroups[short+"Logs"]
		if !ok || lg.RetentionInDays == nil || !slices.Contains(fn.AWSCloudFormationDependsOn, short+"Logs") {
			t.Errorf("%s: no log group %sLogs with a retention, made before it", id, short)
			continue
		}
		if fn.FunctionName == nil || lg.LogGroupName == nil || *lg.LogGroupName != "/aws/lambda/"+*fn.FunctionName {
			t.Errorf("%s: its log group is not the one it writes to (/aws/lambda/<its name>)", id)
		}
	}
	alarms := tmpl.GetAllCloudWatchAlarmResources()
	for _, a := range []string{"OldestQueued", "StaleWorkers", "Redeliveries", "Api5xx", "LambdaThrottles", "LambdaErrors", "DynamoThrottles"} {
		if _, ok := alarms[a+"Alarm"]; !ok {
			t.Errorf("no %sAlarm", a)
		}
	}
	for id, r := range doc.Resources {
		if r.Type != "AWS::CloudWatch::Alarm" {
			continue
		}
		if act := r.Properties["AlarmActions"]; act.Tag != "!If" || act.Content[0].Value != "AlarmNotify" {
			t.Errorf("%s: AlarmActions is not !If [AlarmNotify, …]", id)
		}
	}
}

// TestProvisionerPolicy: the provisioner's EC2 rights are as narrow as EC2
// allows, in template.yaml and in the generated template-iam.yaml:
// RunInstances only from the configured launch template (every resource
// it names, and the instance carrying this stack's tag and a host id),
// CreateTags only as RunInstances creates, TerminateInstances only on this
// stack's instances, and Resource "*" only for Describe* actions (EC2
// supports no resource-level permissions on them). The stack tag the
// policy requires is the one the provisioner adds.
func TestProvisionerPolicy(t *testing.T) {
	const (
		templateARN = "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:launch-template/${ProvisionLaunchTemplate}"
		instanceARN = "arn:${AWS::Partition}:ec2:${AWS::Region}:${AWS::AccountId}:instance/*"
	)
	stackTag := provision.TagStack
	for file, root := range bothTemplates(t) {
		if p := mapping(mapping(mapping(root, "Parameters"), "ProvisionLaunchTemplate"), "AllowedPattern"); p == nil || p.Value != "^(lt-[0-9a-f]+)?$" {
			t.Errorf("%s: ProvisionLaunchTemplate must be a launch template id (the policy names it in an ARN)", file)
		}
		fn := mapping(mapping(root, "Resources"), "ProvisionerFunction")
		props := mapping(fn, "Properties")
		if env := mapping(mapping(mapping(props, "Environment"), "Variables"), "LAKESHORE_PROVISION_STACK"); env == nil || env.Tag != "!Ref" || env.Value != "AWS::StackName" {
			t.Errorf("%s: the provisioner is not told its stack (LAKESHORE_PROVISION_STACK: !Ref AWS::StackName)", file)
		}
		var statements []*yaml.Node
		if policies := mapping(props, "Policies"); policies != nil {
			for _, p := range policies.Content {
				if st := mapping(p, "Statement"); st != nil {
					statements = append(statements, st.Content...)
				}
			}
		}
		seen := map[string]int{}
		for i, st := range statements {
			actions := scalars(mapping(st, "Action"))
			resources := mapping(st, "Resource")
			cond := mapping(st, "Condition")
			where := fmt.Sprintf("%s: ProvisionerFunction statement %d %v", file, i, actions)
			for _, a := range actions {
				if !strings.HasPrefix(a, "ec2:") {
					continue
				}
				seen[a]++
				if strings.HasPrefix(a, "ec2:Describe") {
					continue
				}
				for _, r := range scalars(resources) {
					if r == "*" {
						t.Errorf("%s: %s on Resource \"*\"", where, a)
					}
				}
			}
			switch {
			case slices.Contains(actions, "ec2:RunInstances"):
				if lt := mapping(mapping(cond, "ArnEquals"), "ec2:LaunchTemplate"); lt == nil || lt.Tag != "!Sub" || lt.Value != templateARN {
					t.Errorf("%s: no ArnEquals ec2:LaunchTemplate %s", where, templateARN)
				}
				if slices.Contains(scalars(resources), instanceARN) {
					if st := mapping(mapping(cond, "StringEquals"), "aws:RequestTag/"+stackTag); st == nil || st.Tag != "!Ref" || st.Value != "AWS::StackName" {
						t.Errorf("%s: the instance must carry %s = the stack name", where, stackTag)
					}
					if hid := mapping(mapping(cond, "Null"), "aws:RequestTag/"+provision.TagHostID); hid == nil || hid.Value != "false" {
						t.Errorf("%s: the instance must carry %s", where, provision.TagHostID)
					}
				}
			case slices.Contains(actions, "ec2:CreateTags"):
				if ca := mapping(mapping(cond, "StringEquals"), "ec2:CreateAction"); ca == nil || ca.Value != "RunInstances" {
					t.Errorf("%s: tags other than at RunInstances", where)
				}
			case slices.Contains(actions, "ec2:TerminateInstances"):
				if st := mapping(mapping(cond, "StringEquals"), "aws:ResourceTag/"+stackTag); st == nil || st.Tag != "!Ref" || st.Value != "AWS::StackName" ||
					!slices.Equal(scalars(resources), []string{instanceARN}) {
					t.Errorf("%s: terminates more than instances tagged %s = the stack name", where, stackTag)
				}
			}
			if len(actions) > 1 && slices.ContainsFunc(actions, func(a string) bool { return strings.HasPrefix(a, "ec2:Describe") }) &&
				slices.ContainsFunc(actions, func(a string) bool { return !strings.HasPrefix(a, "ec2:Describe") }) {
				t.Errorf("%s: Describe* share a statement (and its Resource \"*\") with other actions", where)
			}
		}
		for _, a := range []string{"ec2:RunInstances", "ec2:CreateTags", "ec2:TerminateInstances", "ec2:DescribeInstances", "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeLaunchTemplates"} {
			if seen[a] == 0 {
				t.Errorf("%s: the provisioner has no %s (it calls it)", file, a)
			}
		}
	}
}

// TestProvisionerSettings: the stack's provisioner parameters reach its
// function as the environment server/config reads, with the same defaults
// and values: each launched host's capacity and how hosts are bought.
func TestProvisionerSettings(t *testing.T) {
	for file, root := range bothTemplates(t) {
		params := mapping(root, "Parameters")
		vars := mapping(mapping(mapping(mapping(mapping(root, "Resources"), "ProvisionerFunction"), "Properties"), "Environment"), "Variables")
		for env, param := range map[string]string{config.EnvProvisionHostCapacity: "ProvisionHostCapacity", config.EnvProvisionMarket: "ProvisionMarket"} {
			if v := mapping(vars, env); v == nil || v.Tag != "!Ref" || v.Value != param {
				t.Errorf("%s: the provisioner's %s is not !Ref %s", file, env, param)
			}
		}
		if d := mapping(mapping(params, "ProvisionHostCapacity"), "Default"); d == nil || d.Value != strconv.Itoa(config.DefaultProvisionHostCapacity) {
			t.Errorf("%s: ProvisionHostCapacity's default is not %d", file, config.DefaultProvisionHostCapacity)
		}
		market := mapping(params, "ProvisionMarket")
		if d := mapping(market, "Default"); d == nil || d.Value != config.ProvisionMarkets[0] {
			t.Errorf("%s: ProvisionMarket's default is not %s", file, config.ProvisionMarkets[0])
		}
		if got := scalars(mapping(market, "AllowedValues")); !slices.Equal(got, config.ProvisionMarkets) {
			t.Errorf("%s: ProvisionMarket allows %v; the provisioner takes %v", file, got, config.ProvisionMarkets)
		}
	}
}

// scalars reads a YAML scalar or sequence of scalars (an Action, a
// Resource) as a list of its values.
func scalars(n *yaml.Node) []string {
	switch {
	case n == nil:
		return nil
	case n.Kind == yaml.ScalarNode:
		return []string{n.Value}
	}
	var out []string
	for _, c := range n.Content {
		if c.Kind == yaml.ScalarNode {
			out = append(out, c.Value)
		}
	}
	return out
}

// TestArtifactsBucket: the artifacts bucket's guards are in template.yaml
// and the generated template-iam.yaml, so a later edit cannot drop one
// unnoticed: retained on stack delete and replacement; encrypted by
// default (the table key when one is set, else SSE-S3, with a bucket key);
// every public access blocked; ACLs off; objects expiring after
// ArtifactRetentionDays, incomplete multipart uploads aborted and staged
// single uploads expired after a day; every request over plain HTTP
// denied. The bucket and the limits reach exactly the api function (it
// serves the artifact routes, daemon and operator alike), and only it gets
// S3 rights: the actions its blob store calls on the artifact and staging
// keys, and ListBucket on the bucket alone. The daemon functions that run
// per invocation (hello, poll, ack, bye) get none.
func TestArtifactsBucket(t *testing.T) {
	const bucketARN = "!GetAtt ArtifactsBucket.Arn"
	objectActions := []string{"s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"}
	var apiGrants []string
	for _, a := range objectActions {
		apiGrants = append(apiGrants, a+" on !Sub ${ArtifactsBucket.Arn}/artifacts/*", a+" on !Sub ${ArtifactsBucket.Arn}/uploads/*")
	}
	apiGrants = append(apiGrants, "s3:ListBucket on "+bucketARN)
	slices.Sort(apiGrants)
	wantGrants := map[string][]string{"ApiFunction": apiGrants}
	// The keys the blob store writes: blobs.Key's, and server/blobs/s3.go's
	// staging prefix.
	if k := blobs.Key("inv", 1, "name"); !strings.HasPrefix(k, "artifacts/") {
		t.Fatalf("blobs.Key is %q, not under artifacts/: update the policy and this test", k)
	}

	for file, root := range bothTemplates(t) {
		resources := mapping(root, "Resources")

		params := mapping(root, "Parameters")
		for name, def := range map[string]string{
			"ArtifactRetentionDays":  "30",
			"MaxArtifactBytes":       strconv.FormatInt(domain.DefaultMaxArtifactBytes, 10),
			"MaxArtifactsPerAttempt": strconv.Itoa(domain.DefaultMaxArtifactsPerAttempt),
		} {
			p := mapping(params, name)
			if typ, d, lo := mapping(p, "Type"), mapping(p, "Default"), mapping(p, "MinValue"); typ == nil || typ.Value != "Number" ||
				d == nil || d.Value != def || lo == nil || lo.Value != "1" {
				t.Errorf("%s: parameter %s is not a Number, default %s, MinValue 1", file, name, def)
			}
		}
		// A value the functions refuse at start (server/config) would
		// take the api function down: the bounds are theirs.
		for name, hi := range map[string]string{"MaxArtifactBytes": "107374182400", "MaxArtifactsPerAttempt": "1000"} {
			if v := mapping(mapping(params, name), "MaxValue"); v == nil || v.Value != hi {
				t.Errorf("%s: parameter %s has no MaxValue %s", file, name, hi)
			}
		}

		var buckets []string
		for i := 0; i+1 < len(resources.Content); i += 2 {
			if typ := mapping(resources.Content[i+1], "Type"); typ != nil && typ.Value == "AWS::S3::Bucket" {
				buckets = append(buckets, resources.Content[i].Value)
			}
		}
		if !slices.Equal(buckets, []string{"ArtifactsBucket"}) {
			t.Fatalf("%s: buckets %v, want [ArtifactsBucket] (check a new one's guards and update this test)", file, buckets)
		}
		bucket := mapping(resources, "ArtifactsBucket")
		for _, k := range []string{"DeletionPolicy", "UpdateReplacePolicy"} {
			if v := mapping(bucket, k); v == nil || v.Value != "Retain" {
				t.Errorf("%s: ArtifactsBucket %s is not Retain", file, k)
			}
		}
		props := mapping(bucket, "Properties")

		enc := mapping(mapping(props, "BucketEncryption"), "ServerSideEncryptionConfiguration")
		if enc == nil || len(enc.Content) != 1 {
			t.Errorf("%s: ArtifactsBucket has not one default encryption rule", file)
		} else {
			rule := enc.Content[0]
			if v := mapping(rule, "BucketKeyEnabled"); v == nil || v.Value != "true" {
				t.Errorf("%s: ArtifactsBucket encryption without BucketKeyEnabled", file)
			}
			sse := mapping(rule, "ServerSideEncryptionByDefault")
			if sse == nil || sse.Tag != "!If" || len(sse.Content) != 3 || sse.Content[0].Value != "UseTableKey" {
				t.Errorf("%s: ArtifactsBucket encryption is not !If [UseTableKey, …]", file)
			} else {
				kms, s3 := sse.Content[1], sse.Content[2]
				if alg, key := mapping(kms, "SSEAlgorithm"), mapping(kms, "KMSMasterKeyID"); alg == nil || alg.Value != "aws:kms" ||
					key == nil || key.Tag != "!Ref" || key.Value != "TableKmsKeyArn" {
					t.Errorf("%s: with UseTableKey, ArtifactsBucket is not aws:kms with TableKmsKeyArn", file)
				}
				if alg := mapping(s3, "SSEAlgorithm"); alg == nil || alg.Value != "AES256" {
					t.Errorf("%s: without UseTableKey, ArtifactsBucket is not AES256", file)
				}
			}
		}

		block := mapping(props, "PublicAccessBlockConfiguration")
		for _, k := range []string{"BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"} {
			if v := mapping(block, k); v == nil || v.Value != "true" {
				t.Errorf("%s: ArtifactsBucket %s is not true", file, k)
			}
		}
		owners := mapping(mapping(props, "OwnershipControls"), "Rules")
		if owners == nil || len(owners.Content) != 1 || mapping(owners.Content[0], "ObjectOwnership") == nil ||
			mapping(owners.Content[0], "ObjectOwnership").Value != "BucketOwnerEnforced" {
			t.Errorf("%s: ArtifactsBucket ownership is not BucketOwnerEnforced", file)
		}

		var expiry, abort, staged bool
		rules := mapping(mapping(props, "LifecycleConfiguration"), "Rules")
		for i, r := range items(rules) {
			if s := mapping(r, "Status"); s == nil || s.Value != "Enabled" {
				t.Errorf("%s: lifecycle rule %d is not Enabled", file, i)
				continue
			}
			if mapping(r, "Filter") != nil || mapping(r, "TagFilters") != nil {
				t.Errorf("%s: lifecycle rule %d filters other than by Prefix", file, i)
				continue
			}
			prefix := ""
			if p := mapping(r, "Prefix"); p != nil {
				prefix = p.Value
			}
			days := mapping(r, "ExpirationInDays")
			switch {
			case prefix == "" && days != nil && days.Tag == "!Ref" && days.Value == "ArtifactRetentionDays":
				expiry = true
			case prefix == "uploads/" && days != nil && days.Value == "1":
				staged = true
			}
			if d := mapping(mapping(r, "AbortIncompleteMultipartUpload"), "DaysAfterInitiation"); prefix == "" && d != nil && d.Value == "1" {
				abort = true
			}
		}
		if !expiry {
			t.Errorf("%s: no lifecycle rule expires every object after ArtifactRetentionDays", file)
		}
		if !abort {
			t.Errorf("%s: no lifecycle rule aborts every incomplete multipart upload after 1 day", file)
		}
		if !staged {
			t.Errorf("%s: no lifecycle rule expires the staged uploads (uploads/) after 1 day", file)
		}

		tlsOnly := false
		for i := 0; i+1 < len(resources.Content); i += 2 {
			res := resources.Content[i+1]
			if typ := mapping(res, "Type"); typ == nil || typ.Value != "AWS::S3::BucketPolicy" {
				continue
			}
			p := mapping(res, "Properties")
			if b := mapping(p, "Bucket"); b == nil || b.Tag != "!Ref" || b.Value != "ArtifactsBucket" {
				continue
			}
			for _, st := range items(mapping(mapping(p, "PolicyDocument"), "Statement")) {
				principal, secure := mapping(st, "Principal"), mapping(mapping(mapping(st, "Condition"), "Bool"), "aws:SecureTransport")
				res := resourceRefs(mapping(st, "Resource"))
				slices.Sort(res)
				if effect := mapping(st, "Effect"); effect != nil && effect.Value == "Deny" && principal != nil && principal.Value == "*" &&
					slices.Equal(scalars(mapping(st, "Action")), []string{"s3:*"}) &&
					slices.Equal(res, []string{bucketARN, "!Sub ${ArtifactsBucket.Arn}/*"}) &&
					secure != nil && secure.Value == "false" {
					tlsOnly = true
				}
			}
		}
		if !tlsOnly {
			t.Errorf("%s: no bucket policy denies every request on ArtifactsBucket and its objects without aws:SecureTransport", file)
		}

		// The bucket and the limits: on exactly the api function.
		if vars := mapping(mapping(mapping(mapping(root, "Globals"), "Function"), "Environment"), "Variables"); mapping(vars, "LAKESHORE_ARTIFACTS_BUCKET") != nil {
			t.Errorf("%s: Globals hand every function the artifacts bucket", file)
		}
		env := map[string]string{
			"LAKESHORE_ARTIFACTS_BUCKET":          "!Ref ArtifactsBucket",
			"LAKESHORE_MAX_ARTIFACT_BYTES":        "!Sub ${MaxArtifactBytes}",
			"LAKESHORE_MAX_ARTIFACTS_PER_ATTEMPT": "!Sub ${MaxArtifactsPerAttempt}",
		}
		reached := map[*yaml.Node]bool{}
		functions := 0
		for i := 0; i+1 < len(resources.Content); i += 2 {
			id, res := resources.Content[i].Value, resources.Content[i+1]
			if typ := mapping(res, "Type"); typ == nil || typ.Value != "AWS::Serverless::Function" {
				continue
			}
			functions++
			props := mapping(res, "Properties")
			_, artifacts := wantGrants[id]
			vars := mapping(mapping(props, "Environment"), "Variables")
			for name, ref := range env {
				v := mapping(vars, name)
				switch {
				case artifacts && !slices.Equal(resourceRefs(v), []string{ref}):
					t.Errorf("%s: %s has no %s: %s", file, id, name, ref)
				case !artifacts && v != nil:
					t.Errorf("%s: %s has %s; only the api function uses artifacts", file, id, name)
				}
			}
			var grants []string
			for _, st := range functionStatements(resources, mapping(props, "Policies")) {
				reached[st] = true
				for _, a := range scalars(mapping(st, "Action")) {
					if !strings.HasPrefix(strings.ToLower(a), "s3:") {
						continue
					}
					if e := mapping(st, "Effect"); e == nil || e.Value != "Allow" {
						continue
					}
					for _, r := range resourceRefs(mapping(st, "Resource")) {
						grants = append(grants, a+" on "+r)
					}
				}
			}
			slices.Sort(grants)
			if !slices.Equal(grants, wantGrants[id]) {
				t.Errorf("%s: %s's S3 rights:\n  %v\nwant:\n  %v", file, id, grants, wantGrants[id])
			}
			// With TableKmsKeyArn, S3 encrypts and decrypts with the key
			// as the one who signed the URL: the functions that sign hold
			// TableKeyPolicy.
			if artifacts && !slices.ContainsFunc(items(mapping(props, "Policies")), func(n *yaml.Node) bool {
				return n.Tag == "!Ref" && n.Value == "TableKeyPolicy"
			}) {
				t.Errorf("%s: %s does not hold TableKeyPolicy (the artifacts bucket's KMS key)", file, id)
			}
		}
		if functions != 9 {
			t.Errorf("%s: %d functions; this test knows 9", file, functions)
		}
		key := mapping(mapping(mapping(resources, "TableKeyPolicy"), "Properties"), "PolicyDocument")
		for _, st := range items(mapping(key, "Statement")) {
			acts := scalars(mapping(st, "Action"))
			r := mapping(st, "Resource")
			if !slices.Contains(acts, "kms:GenerateDataKey") || !slices.Contains(acts, "kms:Decrypt") ||
				r == nil || r.Tag != "!If" || len(r.Content) != 3 || r.Content[0].Value != "UseTableKey" || r.Content[1].Value != "TableKmsKeyArn" {
				t.Errorf("%s: TableKeyPolicy does not grant kms:GenerateDataKey and kms:Decrypt on TableKmsKeyArn", file)
			}
		}
		// No statement anywhere else (a role, a policy attached to a role,
		// a managed policy no function names) grants S3.
		walk(root, func(n *yaml.Node) {
			if n.Kind != yaml.MappingNode || reached[n] || mapping(n, "Effect") == nil || mapping(n, "Effect").Value != "Allow" {
				return
			}
			for _, a := range scalars(mapping(n, "Action")) {
				if strings.HasPrefix(strings.ToLower(a), "s3:") {
					t.Errorf("%s: a statement no function holds through its Policies grants %s (line %d)", file, a, n.Line)
				}
			}
		})
		for i := 0; i+1 < len(resources.Content); i += 2 {
			res := resources.Content[i+1]
			if typ := mapping(res, "Type"); typ != nil && typ.Value == "AWS::IAM::ManagedPolicy" {
				p := mapping(res, "Properties")
				if mapping(p, "Roles") != nil || mapping(p, "Users") != nil || mapping(p, "Groups") != nil {
					t.Errorf("%s: %s is attached to more than the functions that name it", file, resources.Content[i].Value)
				}
			}
		}
	}
}

// functionStatements lists the IAM statements a SAM function's Policies
// grant: inline policy documents, the managed policies of this template it
// names by !Ref, and both branches of an !If.
func functionStatements(resources, policies *yaml.Node) []*yaml.Node {
	if policies == nil {
		return nil
	}
	var out []*yaml.Node
	var add func(p *yaml.Node)
	add = func(p *yaml.Node) {
		switch {
		case p.Tag == "!If" && len(p.Content) == 3:
			add(p.Content[1])
			add(p.Content[2])
		case p.Tag == "!Ref":
			if doc := mapping(mapping(mapping(resources, p.Value), "Properties"), "PolicyDocument"); doc != nil {
				add(doc)
			}
		case p.Kind == yaml.MappingNode:
			if st := mapping(p, "Statement"); st != nil {
				for _, s := range st.Content {
					add(s)
				}
			} else if mapping(p, "Effect") != nil {
				out = append(out, p)
			}
		}
	}
	for _, p := range policies.Content {
		add(p)
	}
	return out
}

// resourceRefs reads an IAM Resource (one or a list; plain, !Sub or
// !GetAtt) as "<tag> <value>" strings ("!GetAtt ArtifactsBucket.Arn").
func resourceRefs(n *yaml.Node) []string {
	if n == nil {
		return nil
	}
	one := func(n *yaml.Node) string {
		if n.Tag != "" && n.Tag[0] == '!' && n.Tag != "!!str" {
			return n.Tag + " " + n.Value
		}
		return n.Value
	}
	if n.Kind == yaml.ScalarNode {
		return []string{one(n)}
	}
	var out []string
	for _, c := range n.Content {
		out = append(out, one(c))
	}
	return out
}

// walk calls f on n and every node under it.
func walk(n *yaml.Node, f func(*yaml.Node)) {
	f(n)
	for _, c := range n.Content {
		walk(c, f)
	}
}

// bothTemplates reads template.yaml and the generated template-iam.yaml
// as YAML, each file's name to its root node.
func bothTemplates(t *testing.T) map[string]*yaml.Node {
	t.Helper()
	out := map[string]*yaml.Node{}
	for _, file := range []string{"template.yaml", "template-iam.yaml"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(src, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out[file] = doc.Content[0]
	}
	return out
}

// items reads a YAML sequence's (or mapping's) nodes; none for nil.
func items(n *yaml.Node) []*yaml.Node {
	if n == nil {
		return nil
	}
	return n.Content
}
