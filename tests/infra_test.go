package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/awslabs/goformation/v7/intrinsics"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/waittest"
)

// The infra/ files are checked here: the systemd unit with systemd-analyze
// and against nymph's own timing budgets, the user data by running it twice
// in a sandbox with stub aws/curl/systemctl, the IAM policies for narrowness,
// the CloudFormation fleet template with cfn-lint and by rendering it, and
// the copies among them (tests fail until infra/sync.sh is run). The
// sd_notify protocol is checked end to end with the real bin/nymph.

// infraNeedTool returns the path of a tool the test needs; without it the test
// is skipped, or fails under CI=true (CI runs on the same machine image,
// where systemd-analyze and cfn-lint are installed).
func infraNeedTool(t *testing.T, name string, alt ...string) string {
	t.Helper()
	for _, n := range append([]string{name}, alt...) {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
		if filepath.IsAbs(n) {
			if _, err := os.Stat(n); err == nil {
				return n
			}
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not installed (CI=true: required)", name)
	}
	t.Skipf("%s is not installed; skipping (required under CI=true)", name)
	return ""
}

// infraUnitSettings parses a systemd unit into section.Key → values.
func infraUnitSettings(t *testing.T, text string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	section := ""
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			section = strings.Trim(l, "[]")
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("unit line %q is not Key=value", l)
			}
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

func infraFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "infra", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInfraUnitVerifies: systemd-analyze verify finds nothing to say about
// infra/nymph.service (ExecStart pointed at the built binary, since
// /usr/local/bin/nymph exists only on a deployed host), with and without the
// user data's shutdown drop-in; and it does flag a broken copy, so its
// silence means something on this machine.
func TestInfraUnitVerifies(t *testing.T) {
	analyze := infraNeedTool(t, "systemd-analyze", "/usr/bin/systemd-analyze")
	unit := infraFile(t, "nymph.service")
	if !strings.Contains(unit, "\nExecStart=/usr/local/bin/nymph\n") {
		t.Fatal("nymph.service: ExecStart is not /usr/local/bin/nymph")
	}
	verify := func(name, text string) string {
		dir := t.TempDir()
		text = strings.Replace(text, "\nExecStart=/usr/local/bin/nymph\n", "\nExecStart="+bin(t, "nymph")+"\n", 1)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--man=no", "--recursive-errors=no", path).CombinedOutput()
		if err != nil {
			return fmt.Sprintf("exit %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if out := verify("nymph.service", unit); out != "" {
		t.Errorf("systemd-analyze verify nymph.service:\n%s", out)
	}
	if out := verify("nymph.service", unit+infraShutdownDropIn(t)); out != "" {
		t.Errorf("systemd-analyze verify nymph.service + shutdown drop-in:\n%s", out)
	}
	if out := verify("nymph.service", strings.Replace(unit, "Type=notify", "Type=notifyy\nKillMod=mixed", 1)); !strings.Contains(out, "notifyy") || !strings.Contains(out, "KillMod") {
		t.Errorf("systemd-analyze verify did not flag a broken unit here (%q); its silence proves nothing", out)
	}
}

// infraShutdownDropIn is the drop-in user-data.sh writes for
// SHUTDOWN_WHEN_DONE=yes (its DROPIN heredoc).
func infraShutdownDropIn(t *testing.T) string {
	t.Helper()
	_, rest, ok := strings.Cut(infraFile(t, "user-data.sh"), "<<'DROPIN'\n")
	body, _, ok2 := strings.Cut(rest, "\nDROPIN\n")
	if !ok || !ok2 {
		t.Fatal("user-data.sh: no DROPIN heredoc")
	}
	return body + "\n"
}

// TestInfraShutdownWhenDone: the drop-in's ExecStopPost powers the instance
// off after nymph exited 0 by itself, and only then: not when systemd
// stopped or restarted it (a job for the unit is running), not after a
// failure (Restart= restarts it).
func TestInfraShutdownWhenDone(t *testing.T) {
	var cmd string
	for _, l := range strings.Split(infraShutdownDropIn(t), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStopPost=/bin/sh -c '"); ok {
			cmd = strings.TrimSuffix(v, "'")
		}
	}
	if cmd == "" || strings.ContainsAny(cmd, "'\\%") {
		t.Fatalf("drop-in: want ExecStopPost=/bin/sh -c '…' without quotes, escapes or %% specifiers inside, got %q", cmd)
	}
	cmd = strings.ReplaceAll(cmd, "$$", "$") // what systemd hands the shell
	dir := t.TempDir()
	stub := "#!/bin/sh\necho \"systemctl $*\" >>" + dir + "/calls\n[ \"$1\" = list-jobs ] && cat " + dir + "/jobs\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, result, status, jobs string
		poweroff                   bool
	}{
		{"idle keep-alive or drain command", "success", "0", "", true},
		{"systemctl stop", "success", "0", "42 nymph.service stop running\n", false},
		{"systemctl restart", "success", "0", "43 nymph.service restart running\n", false},
		{"control plane unreachable", "exit-code", "1", "", false},
		{"hello refused", "exit-code", "3", "", false},
		{"host setup failed, unrepaired at keep-alive", "exit-code", "4", "", true},
		{"host setup failed, systemctl stop", "exit-code", "4", "44 nymph.service stop running\n", false},
		{"killed", "signal", "KILL", "", false},
	} {
		_ = os.Remove(filepath.Join(dir, "calls"))
		if err := os.WriteFile(filepath.Join(dir, "jobs"), []byte(tc.jobs), 0o644); err != nil {
			t.Fatal(err)
		}
		c := exec.Command("/bin/sh", "-c", cmd)
		c.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "SERVICE_RESULT=" + tc.result, "EXIT_CODE=exited", "EXIT_STATUS=" + tc.status}
		if out, err := c.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", tc.name, err, out)
		}
		calls, _ := os.ReadFile(filepath.Join(dir, "calls"))
		if got := strings.Contains(string(calls), "systemctl poweroff --no-block"); got != tc.poweroff {
			t.Errorf("%s: poweroff %v, want %v (calls %q)", tc.name, got, tc.poweroff, calls)
		}
	}
}

// TestInfraUnitMatchesTheDaemon: the unit's settings against nymph's own
// behaviour: notify readiness from the main process only, SIGTERM to nymph
// alone, timeouts above its start and stop budgets at the default --grace
// and --kill-after, no restart after the exits a restart cannot cure (usage,
// hello refused, host setup failed: agent/exitcodes.go), and a start rate
// limit that stops a crash loop but not an outage's restarts.
func TestInfraUnitMatchesTheDaemon(t *testing.T) {
	s := infraUnitSettings(t, infraFile(t, "nymph.service"))
	for key, want := range map[string]string{
		"Service.Type":                     "notify",
		"Service.NotifyAccess":             "main",
		"Service.ExecStart":                "/usr/local/bin/nymph",
		"Service.EnvironmentFile":          "/etc/nymph/nymph.env",
		"Service.KillMode":                 "mixed",
		"Service.KillSignal":               "SIGTERM",
		"Service.Restart":                  "on-failure",
		"Service.RestartPreventExitStatus": fmt.Sprintf("%d %d %d %d", agent.ExitUsage, agent.ExitHelloRefused, agent.ExitHostSetupFailed, agent.ExitMachineConflict),
		"Service.StateDirectory":           "nymph",
		"Service.OOMPolicy":                "continue",
		"Install.WantedBy":                 "multi-user.target",
		"Unit.After":                       "network-online.target",
	} {
		if got := s[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	// %S is /var/lib for system units: the state directory nymph's flag
	// defaults also name.
	if got := s["Service.Environment"]; len(got) != 1 || got[0] != "NYMPH_STATE_DIR=%S/nymph/state NYMPH_WORKDIR=%S/nymph/work" {
		t.Errorf("Service.Environment = %q", got)
	}
	secs := func(key string) time.Duration {
		t.Helper()
		v := s[key]
		if len(v) != 1 {
			t.Fatalf("%s: %q, want one value", key, v)
		}
		n, err := strconv.Atoi(strings.TrimSuffix(v[0], "s"))
		if err != nil {
			t.Fatalf("%s=%s: want whole seconds", key, v[0])
		}
		return time.Duration(n) * time.Second
	}
	stop, start := secs("Service.TimeoutStopSec"), secs("Service.TimeoutStartSec")
	grace, killAfter := agent.DefaultGrace, agent.DefaultKillAfter
	if simple := grace + killAfter + 2*time.Second; stop <= simple {
		t.Errorf("TimeoutStopSec %s <= grace %s + kill-after %s + bye 2s", stop, grace, killAfter)
	}
	if budget := agent.StopBudget(grace, killAfter); stop <= budget {
		t.Errorf("TimeoutStopSec %s <= nymph's longest drain %s (agent.StopBudget at the default grace and kill-after)", stop, budget)
	}
	if budget := agent.StartBudget(); start <= budget {
		t.Errorf("TimeoutStartSec %s <= nymph's longest start before READY=1 %s (agent.StartBudget: hello's bounded retries)", start, budget)
	}
	restart, interval := secs("Service.RestartSec"), secs("Unit.StartLimitIntervalSec")
	burst, err := strconv.Atoi(strings.Join(s["Unit.StartLimitBurst"], ""))
	if err != nil {
		t.Fatalf("StartLimitBurst: %v", err)
	}
	// systemd refuses a start when burst starts already fell inside the
	// interval: the (burst+1)th start comes burst cycles after the first.
	if crashing := time.Duration(burst) * (restart + 5*time.Second); crashing >= interval {
		t.Errorf("a crash loop (exit 1 within 5 s) restarts forever: %d cycles of %s = %s >= StartLimitIntervalSec %s",
			burst, restart+5*time.Second, crashing, interval)
	}
	if outage := time.Duration(burst) * (restart + agent.HelloBackoffTotal()); outage <= interval {
		t.Errorf("an outage trips the start limit: %d cycles of %s = %s <= StartLimitIntervalSec %s; nymph would stop retrying",
			burst, restart+agent.HelloBackoffTotal(), outage, interval)
	}
}

// TestInfraCopiesAgree: infra/sync.sh, run on a copy of infra/, changes
// nothing — the unit inside user-data.sh and the user data inside
// fleet.yaml are up to date — and a second run is a no-op too.
func TestInfraCopiesAgree(t *testing.T) {
	for _, f := range []string{"user-data.sh", "sync.sh"} {
		if out, err := exec.Command("bash", "-n", filepath.Join("..", "infra", f)).CombinedOutput(); err != nil {
			t.Errorf("bash -n infra/%s: %v\n%s", f, err, out)
		}
	}
	dir := t.TempDir()
	names := []string{"nymph.service", "user-data.sh", "fleet.yaml", "sync.sh"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(infraFile(t, n)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for run := 1; run <= 2; run++ {
		if out, err := exec.Command("bash", filepath.Join(dir, "sync.sh")).CombinedOutput(); err != nil {
			t.Fatalf("sync.sh: %v\n%s", err, out)
		}
		for _, n := range names {
			got, _ := os.ReadFile(filepath.Join(dir, n))
			if string(got) != infraFile(t, n) {
				t.Errorf("run %d: infra/sync.sh changes infra/%s: a copy is stale; run infra/sync.sh", run, n)
			}
		}
	}
	unit := infraFile(t, "nymph.service")
	if !strings.Contains(infraFile(t, "user-data.sh"), "<<'UNIT'\n"+unit+"UNIT\n") {
		t.Error("user-data.sh does not carry infra/nymph.service verbatim; run infra/sync.sh")
	}
}

// infraPolicyPlaceholders are the ${…} names the policies may use; docs/deploy.md
// says what each is.
var infraPolicyPlaceholders = []string{
	"AWS::Partition", "AWS::Region", "AWS::AccountId", "AWS::URLSuffix",
	"EnrollTokenParameter", "NymphBucket", "NymphKey",
	"OperatorTokenParameter", "ControlPlaneStack", "FleetStack", "HttpApiId", "WakeApiId",
}

type infraPolicyStatement struct {
	Sid       string
	Effect    string
	Action    any
	NotAction any
	Resource  any
	Condition map[string]map[string]any
}

func infraStringsOf(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			s, _ := e.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// TestInfraPolicies: both IAM documents parse, allow only named actions
// (no "*", no service:*, no NotAction), name resources by ARN (a bare "*"
// only for EC2 Describe calls, which take no resource), use only documented
// placeholders, and grant what their role needs and no more.
func TestInfraPolicies(t *testing.T) {
	docs := map[string]string{}
	for _, name := range []string{"agent-policy.json", "operator-policy.json", "agent-iam-mode-policy.json"} {
		docs[name] = infraFile(t, filepath.Join("iam", name))
	}
	docMD, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string][]string{}
	for name, text := range docs {
		var doc struct {
			Version   string
			Statement []infraPolicyStatement
		}
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if doc.Version != "2012-10-17" || len(doc.Statement) == 0 {
			t.Errorf("%s: version %q, %d statements", name, doc.Version, len(doc.Statement))
		}
		for _, m := range regexp.MustCompile(`\$\{([^}]*)\}`).FindAllStringSubmatch(text, -1) {
			if !slices.Contains(infraPolicyPlaceholders, m[1]) {
				t.Errorf("%s: placeholder ${%s} is not one of %v", name, m[1], infraPolicyPlaceholders)
			}
			if !bytes.Contains(docMD, []byte("${"+m[1]+"}")) {
				t.Errorf("%s: placeholder ${%s} is not explained in docs/deploy.md", name, m[1])
			}
		}
		for _, st := range doc.Statement {
			acts := infraStringsOf(st.Action)
			if st.Effect != "Allow" || st.NotAction != nil || len(acts) == 0 || st.Sid == "" {
				t.Errorf("%s %s: effect %q, NotAction %v, %d actions", name, st.Sid, st.Effect, st.NotAction, len(acts))
			}
			describeOnly := true
			for _, a := range acts {
				if strings.Contains(a, "*") || !strings.Contains(a, ":") {
					t.Errorf("%s %s: action %q is a wildcard", name, st.Sid, a)
				}
				describeOnly = describeOnly && strings.HasPrefix(a, "ec2:Describe")
				actions[name] = append(actions[name], a)
			}
			for _, r := range infraStringsOf(st.Resource) {
				if r == "*" && !describeOnly {
					t.Errorf("%s %s: Resource \"*\" for %v (only EC2 Describe calls, which take no resource, may)", name, st.Sid, acts)
				}
				if r != "*" && !strings.HasPrefix(r, "arn:${AWS::Partition}:") {
					t.Errorf("%s %s: resource %q is not an ARN", name, st.Sid, r)
				}
			}
			if slices.Contains(acts, "kms:Decrypt") {
				c := st.Condition["StringEquals"]
				if c["kms:ViaService"] != "ssm.${AWS::Region}.${AWS::URLSuffix}" || c["kms:EncryptionContext:PS_ARN"] == nil {
					t.Errorf("%s %s: kms:Decrypt without the via-SSM and parameter conditions: %v", name, st.Sid, st.Condition)
				}
			}
		}
		slices.Sort(actions[name])
	}
	if want := []string{"kms:Decrypt", "s3:GetObject", "ssm:GetParameter"}; !slices.Equal(actions["agent-policy.json"], want) {
		t.Errorf("agent policy actions %v, want %v (the agent reads its token and binary; it talks to the API with tokens)", actions["agent-policy.json"], want)
	}
	if !strings.Contains(docs["agent-iam-mode-policy.json"], "${WakeApiId}/wake/$connect") {
		t.Error("the IAM-mode agent policy does not let the instance open its wake socket ($connect is behind AWS_IAM there)")
	}
	for _, a := range actions["operator-policy.json"] {
		verb := a[strings.Index(a, ":")+1:]
		if !strings.HasPrefix(verb, "Get") && !strings.HasPrefix(verb, "Describe") && !strings.HasPrefix(verb, "Filter") && a != "kms:Decrypt" {
			t.Errorf("operator policy: %s is not a read", a)
		}
	}
}

// infraFleetValues are the parameters the fleet template is rendered with, and
// the pseudo parameters CloudFormation would fill in.
var infraFleetValues = map[string]string{
	"AWS::Partition": "aws", "AWS::Region": "eu-west-1", "AWS::AccountId": "123456789012",
	"AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "fleet-test",
	"ControlPlaneUrl": "https://abc123.execute-api.eu-west-1.amazonaws.com", "EnrollTokenParameter": "/lakeshore/enroll-token",
	"NymphBucket": "artifacts-bucket", "NymphKey": "lakeshore/nymph-v1", "NymphSha256": strings.Repeat("ab", 32), "Queue": "batch", "Capacity": "4",
	"KeepAlive": "15m", "Grace": "45s", "AdoptHostSetup": "true", "ShutdownWhenDone": "yes", "UseSpot": "yes",
	"InstanceType": "m7i.large", "VolumeSize": "30", "VpcId": "vpc-1", "SubnetId": "",
}

// infraSubstitute fills ${Name} from values and reports names it does not know.
func infraSubstitute(s string, values map[string]string) (string, []string) {
	var unknown []string
	out := regexp.MustCompile(`\$\{([^}]*)\}`).ReplaceAllStringFunc(s, func(m string) string {
		name := m[2 : len(m)-1]
		v, ok := values[name]
		if !ok {
			unknown = append(unknown, name)
		}
		return v
	})
	return out, unknown
}

// infraRenderFleet resolves infra/fleet.yaml's intrinsic functions with values,
// as CloudFormation would for a stack with those parameters.
func infraRenderFleet(t *testing.T, values map[string]string) map[string]any {
	t.Helper()
	var unknown []string
	sub := func(_ string, input, _ any) any {
		s, ok := input.(string)
		if !ok {
			t.Fatalf("Fn::Sub with %T: this renderer takes the one-string form only", input)
		}
		out, u := infraSubstitute(s, values)
		unknown = append(unknown, u...)
		return out
	}
	ref := func(_ string, input, _ any) any {
		name, _ := input.(string)
		if name == "AWS::NoValue" {
			return nil
		}
		if v, ok := values[name]; ok {
			return v
		}
		return name // a resource's logical id
	}
	out, err := intrinsics.ProcessYAML([]byte(infraFile(t, "fleet.yaml")), &intrinsics.ProcessorOptions{
		IntrinsicHandlerOverrides: map[string]intrinsics.IntrinsicHandler{"Fn::Sub": sub, "Ref": ref},
		ParameterOverrides:        map[string]any{"UseSpot": values["UseSpot"], "SubnetId": values["SubnetId"]},
		EvaluateConditions:        true,
	})
	if err != nil {
		t.Fatalf("render fleet.yaml: %v", err)
	}
	if len(unknown) > 0 {
		t.Fatalf("fleet.yaml substitutes unknown names %v", unknown)
	}
	var tmpl map[string]any
	if err := json.Unmarshal(out, &tmpl); err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func infraDig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// TestInfraFleetTemplate: cfn-lint passes infra/fleet.yaml; rendered, its
// instance role carries exactly infra/iam/agent-policy.json, its launch
// template requires IMDSv2 with hop limit 1 and asks for spot only when
// told, and its user data is a few settings followed by infra/user-data.sh
// verbatim, under EC2's 16 KB limit.
func TestInfraFleetTemplate(t *testing.T) {
	lint := infraNeedTool(t, "cfn-lint", "/root/.pyenv/shims/cfn-lint")
	if out, err := exec.Command(lint, filepath.Join("..", "infra", "fleet.yaml")).CombinedOutput(); err != nil {
		t.Errorf("cfn-lint infra/fleet.yaml: %v\n%s", err, out)
	}

	tmpl := infraRenderFleet(t, infraFleetValues)
	res := func(name string) map[string]any {
		props, _ := infraDig(tmpl, "Resources", name, "Properties").(map[string]any)
		if props == nil {
			t.Fatalf("fleet.yaml: no %s", name)
		}
		return props
	}
	policies, _ := res("AgentRole")["Policies"].([]any)
	if len(policies) != 1 || res("AgentRole")["ManagedPolicyArns"] != nil {
		t.Fatalf("AgentRole: want exactly one inline policy and no managed ones")
	}
	agentJSON, unknown := infraSubstitute(infraFile(t, "iam/agent-policy.json"), infraFleetValues)
	if len(unknown) > 0 {
		t.Fatalf("agent-policy.json: unknown placeholders %v", unknown)
	}
	var want any
	if err := json.Unmarshal([]byte(agentJSON), &want); err != nil {
		t.Fatal(err)
	}
	if got := infraDig(policies[0], "PolicyDocument"); !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		t.Errorf("AgentRole's policy differs from infra/iam/agent-policy.json:\n%s", g)
	}

	data := res("LaunchTemplate")["LaunchTemplateData"]
	if got := fmt.Sprint(infraDig(data, "MetadataOptions")); got != "map[HttpEndpoint:enabled HttpPutResponseHopLimit:1 HttpTokens:required]" {
		t.Errorf("MetadataOptions %s: want IMDSv2 required, hop limit 1", got)
	}
	if got := infraDig(data, "InstanceMarketOptions", "MarketType"); got != "spot" {
		t.Errorf("UseSpot=yes: market type %v", got)
	}
	noSpot := map[string]string{}
	for k, v := range infraFleetValues {
		noSpot[k] = v
	}
	noSpot["UseSpot"] = "no"
	if got := infraDig(infraRenderFleet(t, noSpot), "Resources", "LaunchTemplate", "Properties", "LaunchTemplateData", "InstanceMarketOptions"); got != nil {
		t.Errorf("UseSpot=no: InstanceMarketOptions %v", got)
	}

	userData := infraFleetUserData(t, tmpl)
	script := infraFile(t, "user-data.sh")
	header, ok := strings.CutSuffix(string(userData), script)
	if !ok {
		t.Fatal("the launch template's user data does not end with infra/user-data.sh verbatim; run infra/sync.sh")
	}
	if len(userData) > 16384 {
		t.Errorf("user data is %d bytes; EC2 takes 16 KB", len(userData))
	}
	if !strings.HasPrefix(header, "#!/bin/bash\n") {
		t.Errorf("user data must start with a shebang line for cloud-init, got %q", header[:min(len(header), 40)])
	}
	for _, l := range strings.Split(strings.TrimSpace(header), "\n")[1:] {
		if !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "export ") && !strings.HasPrefix(l, "NYMPH_") {
			t.Errorf("user data header line %q: only settings belong there", l)
		}
	}
}

// TestInfraFleetSubnet: with SubnetId the launch template puts every
// instance in that subnet (a network interface carrying the workers'
// security group, which then is not also at the top level: EC2 refuses
// both), so a launch that names no subnet, as the provisioner's, works;
// without it the template names no subnet and keeps the security group at
// the top level.
func TestInfraFleetSubnet(t *testing.T) {
	data := func(subnet string) any {
		values := maps.Clone(infraFleetValues)
		values["SubnetId"] = subnet
		return infraDig(infraRenderFleet(t, values), "Resources", "LaunchTemplate", "Properties", "LaunchTemplateData")
	}
	none := data("")
	if got := fmt.Sprint(infraDig(none, "SecurityGroupIds")); got != "[WorkerSecurityGroup]" || infraDig(none, "NetworkInterfaces") != nil {
		t.Errorf("no SubnetId: SecurityGroupIds %s, NetworkInterfaces %v; want the group at the top level and no interface", got, infraDig(none, "NetworkInterfaces"))
	}
	set := data("subnet-0123456789abcdef0")
	want := "[map[DeleteOnTermination:true DeviceIndex:0 Groups:[WorkerSecurityGroup] SubnetId:subnet-0123456789abcdef0]]"
	if got := fmt.Sprint(infraDig(set, "NetworkInterfaces")); got != want || infraDig(set, "SecurityGroupIds") != nil {
		t.Errorf("SubnetId set: NetworkInterfaces %s, SecurityGroupIds %v; want %s and no top-level group", got, infraDig(set, "SecurityGroupIds"), want)
	}
}

// infraFleetUserData decodes a rendered fleet template's user data.
func infraFleetUserData(t *testing.T, tmpl map[string]any) string {
	t.Helper()
	b64, _ := infraDig(tmpl, "Resources", "LaunchTemplate", "Properties", "LaunchTemplateData", "UserData").(string)
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) == 0 {
		t.Fatalf("LaunchTemplate UserData is not base64 (%v): %.80q", err, b64)
	}
	return string(b)
}

// infraSandbox is a fake root where user-data.sh runs with stub aws, curl and
// systemctl that log their calls.
type infraSandbox struct {
	dir, root, stubs, log string
	binary                []byte // what the stubs serve as nymph
	token                 string
}

func infraNewSandbox(t *testing.T) *infraSandbox {
	t.Helper()
	dir := t.TempDir()
	s := &infraSandbox{dir: dir, root: filepath.Join(dir, "root"), stubs: filepath.Join(dir, "stubs"), log: filepath.Join(dir, "calls.log"),
		binary: []byte("#!/bin/sh\n# a stand-in nymph: --help works\nexit 0\n"), token: "enroll-secret-1"}
	for _, d := range []string{s.root, s.stubs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.write(t, "binary", s.binary, 0o755)
	s.write(t, "token", []byte(s.token), 0o600)
	// Stubs record "<tool> <args>" (plus the region aws was given) and act
	// like the real thing for the calls user-data.sh makes.
	stub := func(name, body string) {
		s.write(t, filepath.Join("stubs", name), []byte("#!/usr/bin/env bash\nset -euo pipefail\nD="+dir+"\n"+body), 0o755)
	}
	stub("aws", `echo "aws $* region=${AWS_REGION:-}" >>"$D/calls.log"
case "$1 $2" in
"s3 cp") cp "$D/binary" "${@: -1}" ;;
"ssm get-parameter") cat "$D/token"; echo ;;
*) echo "stub aws: unexpected $*" >&2; exit 2 ;;
esac
`)
	stub("curl", `echo "curl $*" >>"$D/calls.log"
case "$*" in
*api/token*) echo imds-token ;;
*placement/region*) [[ "$*" == *"X-aws-ec2-metadata-token: imds-token"* ]] && echo eu-central-1 ;;
*https://*) out=; while (($#)); do [[ $1 == -o ]] && out=$2; shift; done; cp "$D/binary" "$out" ;;
*) echo "stub curl: unexpected $*" >&2; exit 2 ;;
esac
`)
	stub("systemctl", `echo "systemctl $*" >>"$D/calls.log"`+"\n")
	return s
}

func (s *infraSandbox) write(t *testing.T, rel string, b []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.dir, rel), b, mode); err != nil {
		t.Fatal(err)
	}
}

func (s *infraSandbox) sha() string {
	sum := sha256.Sum256(s.binary)
	return hex.EncodeToString(sum[:])
}

// run runs script (the user data) in the sandbox with env, and returns the
// stub calls it made, its output and its error.
func (s *infraSandbox) run(t *testing.T, script string, env ...string) (calls []string, out string, err error) {
	t.Helper()
	_ = os.Remove(s.log)
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append([]string{"PATH=" + s.stubs + ":" + os.Getenv("PATH"), "HOME=" + s.dir, "ROOT=" + s.root}, env...)
	b, err := cmd.CombinedOutput()
	if raw, rerr := os.ReadFile(s.log); rerr == nil {
		calls = strings.Split(strings.TrimSpace(string(raw)), "\n")
	}
	return calls, string(b), err
}

type infraFileState struct {
	mode    fs.FileMode
	content string
	mtime   time.Time
}

// snapshot lists every file and directory under the sandbox's root.
func (s *infraSandbox) snapshot(t *testing.T) map[string]infraFileState {
	t.Helper()
	out := map[string]infraFileState{}
	err := filepath.WalkDir(s.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := infraFileState{mode: info.Mode(), mtime: info.ModTime()}
		if !d.IsDir() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			st.content = string(b)
		}
		out[strings.TrimPrefix(path, s.root)] = st
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func infraOnly(calls []string, prefix string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func infraSameCalls(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: calls\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestInfraUserDataTwice: user-data.sh in a sandbox: the first run installs
// the binary (sha-checked), the 0600 env file with the token from SSM, the
// unit (identical to infra/nymph.service) and starts it; a second run
// changes no file (not even a timestamp) and only re-asserts enable --now;
// a new token restarts nymph without a daemon-reload; the shutdown drop-in
// comes and goes with SHUTDOWN_WHEN_DONE; a wrong sha installs nothing.
func TestInfraUserDataTwice(t *testing.T) {
	s := infraNewSandbox(t)
	script := infraFile(t, "user-data.sh")
	env := []string{
		"NYMPH_URL=s3://artifacts/lakeshore/nymph", "NYMPH_SHA256=" + s.sha(),
		"CONTROL_PLANE_URL=https://cp.example.com", "QUEUE=batch", "CAPACITY=3",
		"EXTRA_ENV=NYMPH_KEEP_ALIVE=15m\n\nNYMPH_HOST_SETUP=apt-get install -y jq && echo ok",
	}
	start := []string{"systemctl daemon-reload", "systemctl try-restart --no-block nymph.service", "systemctl enable --now --no-block nymph.service"}

	calls, out, err := s.run(t, script, env...)
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	if strings.Contains(out, s.token) {
		t.Errorf("the token appears in the script's output:\n%s", out)
	}
	infraSameCalls(t, "first run", infraOnly(calls, "systemctl"), start...)
	// The region comes from IMDSv2 (AWS_REGION unset), through the stub curl.
	if got := infraOnly(calls, "aws"); len(got) != 2 ||
		got[0] != "aws ssm get-parameter --name /lakeshore/enroll-token --with-decryption --query Parameter.Value --output text region=eu-central-1" ||
		!strings.HasPrefix(got[1], "aws s3 cp --only-show-errors s3://artifacts/lakeshore/nymph ") || !strings.HasSuffix(got[1], " region=eu-central-1") {
		t.Errorf("first run: aws calls %q", got)
	}
	first := s.snapshot(t)
	wantEnv := "# Written by infra/user-data.sh; every nymph flag is also NYMPH_<FLAG>.\n" +
		"NYMPH_CONTROL_PLANE='https://cp.example.com'\nNYMPH_ENROLL_TOKEN='enroll-secret-1'\nNYMPH_QUEUE='batch'\nNYMPH_CAPACITY='3'\n" +
		"NYMPH_KEEP_ALIVE='15m'\nNYMPH_HOST_SETUP='apt-get install -y jq && echo ok'\n"
	for path, want := range map[string]infraFileState{
		"/usr/local/bin/nymph":              {mode: 0o755, content: string(s.binary)},
		"/etc/nymph":                        {mode: fs.ModeDir | 0o700},
		"/etc/nymph/nymph.env":              {mode: 0o600, content: wantEnv},
		"/etc/systemd/system/nymph.service": {mode: 0o644, content: infraFile(t, "nymph.service")},
	} {
		if got, ok := first[path]; !ok || got.mode != want.mode {
			t.Errorf("%s: present %v, mode %v, want %v", path, ok, got.mode, want.mode)
		} else if got.content != want.content {
			t.Errorf("%s: content\n%s\nwant\n%s", path, got.content, want.content)
		}
	}
	if _, ok := first["/etc/systemd/system/nymph.service.d"]; ok {
		t.Error("SHUTDOWN_WHEN_DONE=no, yet there is a drop-in directory")
	}
	infraCheckEnvAgainstFlags(t, first["/etc/nymph/nymph.env"].content)

	time.Sleep(10 * time.Millisecond) // a rewrite would show in the mtimes
	calls, out, err = s.run(t, script, env...)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	infraSameCalls(t, "second run", infraOnly(calls, "systemctl"), "systemctl enable --now --no-block nymph.service")
	if got := infraOnly(calls, "aws s3"); len(got) != 0 {
		t.Errorf("second run downloaded the binary again: %q", got)
	}
	if second := s.snapshot(t); !reflect.DeepEqual(first, second) {
		t.Errorf("second run changed files:\nfirst  %v\nsecond %v", first, second)
	}

	s.write(t, "token", []byte("enroll-secret-2"), 0o600)
	calls, out, err = s.run(t, script, env...)
	if err != nil {
		t.Fatalf("new token: %v\n%s", err, out)
	}
	infraSameCalls(t, "new token", infraOnly(calls, "systemctl"), start[1:]...)
	if got := s.snapshot(t)["/etc/nymph/nymph.env"]; !strings.Contains(got.content, "NYMPH_ENROLL_TOKEN='enroll-secret-2'") || got.mode != 0o600 {
		t.Errorf("env after a new token: %v", got)
	}

	dropin := "/etc/systemd/system/nymph.service.d/shutdown-when-done.conf"
	calls, out, err = s.run(t, script, append(env, "SHUTDOWN_WHEN_DONE=yes")...)
	if err != nil {
		t.Fatalf("shutdown when done: %v\n%s", err, out)
	}
	infraSameCalls(t, "SHUTDOWN_WHEN_DONE=yes", infraOnly(calls, "systemctl"), start...)
	if got := s.snapshot(t)[dropin]; got.content != infraShutdownDropIn(t) || got.mode != 0o644 {
		t.Errorf("drop-in: %v %q", got.mode, got.content)
	}
	calls, _, _ = s.run(t, script, append(env, "SHUTDOWN_WHEN_DONE=yes")...)
	infraSameCalls(t, "SHUTDOWN_WHEN_DONE=yes again", infraOnly(calls, "systemctl"), "systemctl enable --now --no-block nymph.service")
	calls, _, _ = s.run(t, script, env...)
	infraSameCalls(t, "SHUTDOWN_WHEN_DONE=no again", infraOnly(calls, "systemctl"), start...)
	if _, ok := s.snapshot(t)[dropin]; ok {
		t.Errorf("SHUTDOWN_WHEN_DONE=no left %s", dropin)
	}

	before := s.snapshot(t)
	bad := append(slices.Clone(env), "NYMPH_SHA256="+strings.Repeat("0", 64), "NYMPH_URL=https://downloads.example.com/nymph", "CAPACITY=8")
	calls, out, err = s.run(t, script, bad...)
	if err == nil || !strings.Contains(out, "has SHA-256") {
		t.Errorf("a wrong sha256: err %v, output %s", err, out)
	}
	if len(infraOnly(calls, "systemctl")) != 0 || len(infraOnly(calls, "curl -fsSL")) != 1 {
		t.Errorf("a wrong sha256: calls %q (want one https download and no systemctl)", calls)
	}
	if after := s.snapshot(t); !reflect.DeepEqual(before, after) {
		t.Errorf("a wrong sha256 changed files")
	}
	// Refused settings install nothing, even on a fresh host.
	fresh := infraNewSandbox(t)
	for _, tc := range []struct{ name, env, want string }{
		{"no url", "NYMPH_URL=", "NYMPH_URL must be"},
		{"plain http", "NYMPH_URL=http://example.com/nymph", "NYMPH_URL must be"},
		{"no control plane", "CONTROL_PLANE_URL=", "CONTROL_PLANE_URL must be"},
		{"quote", "LABEL=it's", "quotes, backslashes and newlines"},
		{"bad extra", "EXTRA_ENV=PATH=/tmp", "EXTRA_ENV"},
	} {
		calls, out, err := fresh.run(t, script, append(slices.Clone(env), tc.env)...)
		if err == nil || !strings.Contains(out, tc.want) || len(infraOnly(calls, "systemctl")) != 0 || len(infraOnly(calls, "aws s3")) != 0 {
			t.Errorf("%s: err %v, calls %q, output %s", tc.name, err, calls, out)
		}
		if snap := fresh.snapshot(t); len(snap) != 1 {
			t.Errorf("%s: installed %d files", tc.name, len(snap)-1)
		}
	}

}

// TestInfraFleetUserDataRuns: the launch template's user data, rendered with
// a stack's parameters, runs in the sandbox and installs nymph with those
// settings.
func TestInfraFleetUserDataRuns(t *testing.T) {
	s := infraNewSandbox(t)
	values := maps.Clone(infraFleetValues)
	values["NymphSha256"] = s.sha()
	calls, out, err := s.run(t, infraFleetUserData(t, infraRenderFleet(t, values)))
	if err != nil {
		t.Fatalf("fleet user data: %v\n%s", err, out)
	}
	infraSameCalls(t, "fleet user data", infraOnly(calls, "systemctl"),
		"systemctl daemon-reload", "systemctl try-restart --no-block nymph.service", "systemctl enable --now --no-block nymph.service")
	if got := infraOnly(calls, "aws s3"); len(got) != 1 || !strings.HasPrefix(got[0], "aws s3 cp --only-show-errors s3://artifacts-bucket/lakeshore/nymph-v1 ") ||
		!strings.HasSuffix(got[0], "region=eu-west-1") || len(infraOnly(calls, "curl")) != 0 {
		t.Errorf("fleet user data: calls %q", calls)
	}
	snap := s.snapshot(t)
	wantEnv := "# Written by infra/user-data.sh; every nymph flag is also NYMPH_<FLAG>.\n" +
		"NYMPH_CONTROL_PLANE='https://abc123.execute-api.eu-west-1.amazonaws.com'\nNYMPH_ENROLL_TOKEN='enroll-secret-1'\n" +
		"NYMPH_QUEUE='batch'\nNYMPH_CAPACITY='4'\nNYMPH_LABEL='fleet-test'\nNYMPH_KEEP_ALIVE='15m'\nNYMPH_GRACE='45s'\nNYMPH_ADOPT_HOST_SETUP='true'\n"
	if got := snap["/etc/nymph/nymph.env"].content; got != wantEnv {
		t.Errorf("fleet env file:\n%s\nwant\n%s", got, wantEnv)
	}
	if _, ok := snap["/etc/systemd/system/nymph.service.d/shutdown-when-done.conf"]; !ok {
		t.Error("ShutdownWhenDone=yes: no drop-in")
	}
}

// infraCheckEnvAgainstFlags: every NYMPH_<FLAG> the env file sets is a flag
// bin/nymph has (a misspelt name would be silently ignored).
func infraCheckEnvAgainstFlags(t *testing.T, env string) {
	t.Helper()
	help, _ := exec.Command(bin(t, "nymph"), "--help").CombinedOutput()
	for _, l := range strings.Split(env, "\n") {
		k, _, ok := strings.Cut(l, "=")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		flag := "--" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "NYMPH_")), "_", "-")
		if !regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(flag) + `\b`).Match(help) {
			t.Errorf("env file sets %s, but nymph has no %s flag:\n%s", k, flag, help)
		}
	}
}

// infraNotifySocket listens like systemd on a unixgram socket with SO_PASSCRED,
// and returns each datagram with the sender's pid.
type infraNotifyMsg struct {
	pid   int32
	state string
}

func infraNotifySocket(t *testing.T) (string, <-chan infraNotifyMsg) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdn") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
	}); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	out := make(chan infraNotifyMsg, 64)
	go func() {
		defer close(out)
		buf, oob := make([]byte, 4096), make([]byte, 1024)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := infraNotifyMsg{pid: -1, state: string(buf[:n])}
			if scms, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, scm := range scms {
					if cred, err := syscall.ParseUnixCredentials(&scm); err == nil {
						m.pid = cred.Pid
					}
				}
			}
			out <- m
		}
	}()
	return path, out
}

func infraNextNotify(t *testing.T, msgs <-chan infraNotifyMsg, limit time.Duration, what string) infraNotifyMsg {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatalf("notify socket closed waiting for %s", what)
		}
		return m
	case <-time.After(limit):
		t.Fatalf("no notification within %s waiting for %s", limit, what)
	}
	return infraNotifyMsg{}
}

func infraNotifyVars(state string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(state, "\n") {
		k, v, _ := strings.Cut(l, "=")
		out[k] = v
	}
	return out
}

// TestInfraNotify: the real bin/nymph under a stand-in for systemd's notify
// socket. READY=1 comes from nymph's own pid (NotifyAccess=main) once its
// worker is registered and visible to the operator; SIGTERM brings
// STOPPING=1 (with the stop budget as EXTEND_TIMEOUT_USEC), and the process
// exits 0. The first message is READY: nothing before hello.
func TestInfraNotify(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	ctx := context.Background()
	path, msgs := infraNotifySocket(t)
	n := startNymphEnv(t, d, "notify-host", t.TempDir(), []string{"NOTIFY_SOCKET=" + path})
	pid := int32(n.cmd.Process.Pid)

	m := infraNextNotify(t, msgs, 30*time.Second, "READY=1")
	vars := infraNotifyVars(m.state)
	if vars["READY"] != "1" || m.pid != pid {
		t.Fatalf("first notification %q from pid %d; want READY=1 from nymph (pid %d)", m.state, m.pid, pid)
	}
	w, ok := workerNamed(ctx, op, "notify-host")
	if !ok || w.WorkerID == "" || vars["STATUS"] != "registered as "+w.WorkerID+", queue q" {
		t.Fatalf("at READY=1 the operator sees %+v (found %v); STATUS %q", w, ok, vars["STATUS"])
	}
	waittest.Until(t, 20*time.Second, "worker active", func() bool {
		w, _ := workerNamed(ctx, op, "notify-host")
		return w.State == "active"
	})

	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		m := infraNextNotify(t, msgs, 20*time.Second, "STOPPING=1")
		vars := infraNotifyVars(m.state)
		if vars["READY"] != "" {
			t.Fatalf("a second READY=1: %q", m.state)
		}
		if vars["STOPPING"] != "1" {
			continue // STATUS of phases before the drain
		}
		if m.pid != pid {
			t.Errorf("STOPPING=1 from pid %d, want %d", m.pid, pid)
		}
		// startNymph: --grace 5s --kill-after 1s.
		if want := strconv.FormatInt(agent.StopBudget(5*time.Second, time.Second).Microseconds(), 10); vars["EXTEND_TIMEOUT_USEC"] != want {
			t.Errorf("EXTEND_TIMEOUT_USEC %q, want %s", vars["EXTEND_TIMEOUT_USEC"], want)
		}
		if !strings.Contains(vars["STATUS"], "draining (signal)") {
			t.Errorf("STOPPING=1 status %q", vars["STATUS"])
		}
		break
	}
	if code := n.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if w, _ := workerNamed(ctx, op, "notify-host"); w.State != "gone" {
		t.Errorf("after SIGTERM the worker reads %q, want gone", w.State)
	}
}

// TestInfraNotifyBrokenSocket: a NOTIFY_SOCKET nobody listens on changes
// nothing: nymph registers, drains on SIGTERM and exits 0.
func TestInfraNotifyBrokenSocket(t *testing.T) {
	d := startDev(t, backends[0], "--stale-after", "3s")
	op := d.Operator()
	n := startNymphEnv(t, d, "unheard-host", t.TempDir(), []string{"NOTIFY_SOCKET=" + filepath.Join(t.TempDir(), "nobody")})
	waittest.Until(t, 20*time.Second, "worker active", func() bool {
		w, _ := workerNamed(context.Background(), op, "unheard-host")
		return w.State == "active"
	})
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := n.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if got := strings.Count(n.logs.String(), "could not notify the service manager"); got != 1 {
		t.Errorf("%d warnings about the socket, want 1", got)
	}
}

// TestInfraProvisionedHost: on a host the provisioner launched,
// infra/user-data.sh takes the settings its first user-data part wrote
// (provision.Settings): the queue and capacity it was launched for, its
// host setup file and keep-alive after the template's own EXTRA_ENV (so
// they win), and the power-off drop-in.
func TestInfraProvisionedHost(t *testing.T) {
	s := infraNewSandbox(t)
	env, setup, err := provision.Settings(domain.Host{ID: "hst_01J00000000000000000000000",
		Key: domain.ProvisionKey{Queue: "gpu", HostKey: "hk1_x"}, HostSetup: []string{`echo "warm"`}}, 4, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.root, "etc", "lakeshore"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.root, "etc", "lakeshore", "provisioned.env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(setup) == 0 {
		t.Fatal("no host setup file for a host with host setup")
	}
	_, out, err := s.run(t, infraFile(t, "user-data.sh"),
		"NYMPH_URL=s3://artifacts/lakeshore/nymph", "NYMPH_SHA256="+s.sha(), "CONTROL_PLANE_URL=https://cp.example.com",
		"QUEUE=default", "CAPACITY=1", "EXTRA_ENV=NYMPH_KEEP_ALIVE=15m\nNYMPH_GRACE=30s\nNYMPH_ADOPT_HOST_SETUP=true", "SHUTDOWN_WHEN_DONE=no")
	if err != nil {
		t.Fatalf("user-data.sh: %v\n%s", err, out)
	}
	snap := s.snapshot(t)
	got := snap["/etc/nymph/nymph.env"].content
	for _, want := range []string{"NYMPH_QUEUE='gpu'\n", "NYMPH_CAPACITY='4'\n", "NYMPH_LABEL='hst_01J00000000000000000000000'\n",
		// The template's generic workers adopt; this keyed host does not.
		"NYMPH_ADOPT_HOST_SETUP='true'\nNYMPH_KEEP_ALIVE='10m0s'\nNYMPH_HOST_SETUP_FILE='/etc/lakeshore/host-setup.json'\nNYMPH_ADOPT_HOST_SETUP='false'\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("nymph.env lacks %q:\n%s", want, got)
		}
	}
	if _, ok := snap["/etc/systemd/system/nymph.service.d/shutdown-when-done.conf"]; !ok {
		t.Error("a provisioned host does not power off when done")
	}
	infraCheckEnvAgainstFlags(t, got)
}
