package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/awslabs/goformation/v7/intrinsics"

	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// The localstack/ directory, relative to this package.
const (
	composeFile = "../localstack/docker-compose.yml"
	hookScript  = "../localstack/init/ready.d/10-lakeshore-tables.sh"
)

// emulatorEnv is the environment that points the SDK and the AWS CLI at an
// emulator endpoint, whatever the developer's shell holds.
func emulatorEnv(endpoint string) []string {
	return []string{
		"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=us-east-1", "AWS_DEFAULT_REGION=us-east-1",
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_SESSION_TOKEN=",
		"AWS_EC2_METADATA_DISABLED=true",
	}
}

// runWithEnv runs argv with the test environment plus env and returns its
// stdout, stderr and error.
func runWithEnv(t *testing.T, env []string, argv ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	// A profile from the developer's shell may not exist in the test's
	// world; the AWS CLI fails on an unknown (or empty) profile name.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "AWS_PROFILE" && k != "AWS_DEFAULT_PROFILE" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// parseTableStates parses the output of `lakeshore tables`: one "name  state"
// line per table.
func parseTableStates(t *testing.T, out string) map[string]string {
	t.Helper()
	states := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			t.Fatalf("lakeshore tables: unexpected line %q in\n%s", sc.Text(), out)
		}
		states[f[0]] = f[1]
	}
	return states
}

// wantTableStates checks that out names every table of template.yaml under
// prefix, each in state want.
func wantTableStates(t *testing.T, out, prefix, want string) {
	t.Helper()
	defs, err := schema.TableDefinitions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	got := parseTableStates(t, out)
	if len(got) != len(defs) {
		t.Errorf("lakeshore tables printed %d tables, template.yaml has %d:\n%s", len(got), len(defs), out)
	}
	for _, d := range defs {
		if s := got[aws.ToString(d.TableName)]; s != want {
			t.Errorf("table %s: %q, want %q; output:\n%s", aws.ToString(d.TableName), s, want, out)
		}
	}
}

// checkTemplateTables describes every table of template.yaml under prefix on the
// endpoint and compares its key schema and global secondary indexes with
// the template's.
func checkTemplateTables(t *testing.T, endpoint, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	db := storetest.Client(endpoint)
	defs, err := schema.TableDefinitions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range defs {
		name := aws.ToString(d.TableName)
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: d.TableName})
		if err != nil {
			t.Errorf("DescribeTable %s: %v", name, err)
			continue
		}
		if got, want := keySchemaString(out.Table.KeySchema), keySchemaString(d.KeySchema); got != want {
			t.Errorf("table %s key schema %s, want %s", name, got, want)
		}
		gotIdx := map[string]string{}
		for _, g := range out.Table.GlobalSecondaryIndexes {
			gotIdx[aws.ToString(g.IndexName)] = keySchemaString(g.KeySchema)
		}
		wantIdx := map[string]string{}
		for _, g := range d.GlobalSecondaryIndexes {
			wantIdx[aws.ToString(g.IndexName)] = keySchemaString(g.KeySchema)
		}
		if !maps.Equal(gotIdx, wantIdx) {
			t.Errorf("table %s global secondary indexes %v, want %v", name, gotIdx, wantIdx)
		}
	}
}

func keySchemaString(ks []types.KeySchemaElement) string {
	var parts []string
	for _, k := range ks {
		parts = append(parts, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	return strings.Join(parts, ", ")
}

// TestLocalStackHook runs the LocalStack init hook, as LocalStack would run
// it, against moto_server (or LAKESHORE_TEST_AWS_ENDPOINT): twice, since
// LocalStack runs it on every start over possibly persisted state. Every
// table of template.yaml must exist with its key schema, and the token
// parameters must be SecureStrings holding the tokens.
func TestLocalStackHook(t *testing.T) {
	endpoint := storetest.MotoEndpoint(t)
	prefix := storetest.Prefix(t)
	paramRoot := "/" + strings.TrimSuffix(prefix, "-")
	params := map[string]string{
		paramRoot + "/enroll-token":   "enroll-" + prefix,
		paramRoot + "/operator-token": "operator-" + prefix,
	}
	env := append(emulatorEnv(endpoint),
		"LAKESHORE_BIN="+lakeshoreBin(t),
		"LAKESHORE_TABLE_PREFIX="+prefix,
		"LAKESHORE_ENROLL_TOKEN="+params[paramRoot+"/enroll-token"],
		"LAKESHORE_ENROLL_TOKEN_PARAM="+paramRoot+"/enroll-token",
		"LAKESHORE_OPERATOR_TOKEN="+params[paramRoot+"/operator-token"],
		"LAKESHORE_OPERATOR_TOKEN_PARAM="+paramRoot+"/operator-token",
	)
	_, awsErr := exec.LookPath("aws")
	_, awslocalErr := exec.LookPath("awslocal")
	haveCLI := awsErr == nil || awslocalErr == nil

	for run, want := range []string{"created", "present"} {
		stdout, stderr, err := runWithEnv(t, env, hookScript)
		if err != nil {
			t.Fatalf("hook run %d: %v\nstdout:\n%s\nstderr:\n%s", run+1, err, stdout, stderr)
		}
		wantTableStates(t, stdout, prefix, want)
		for _, v := range params {
			if strings.Contains(stdout+stderr, v) {
				t.Errorf("hook run %d printed a token:\n%s%s", run+1, stdout, stderr)
			}
		}
		if !haveCLI && !strings.Contains(stderr, "not stored") {
			t.Errorf("hook run %d without an AWS CLI: want a warning that the parameters were not stored; stderr:\n%s", run+1, stderr)
		}
	}
	checkTemplateTables(t, endpoint, prefix)

	if !haveCLI {
		t.Log("neither aws nor awslocal on PATH: the hook skipped the SSM parameters, as it should; not checking them")
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sc := ssm.NewFromConfig(aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
	}, func(o *ssm.Options) { o.BaseEndpoint = aws.String(endpoint) })
	for name, want := range params {
		out, err := sc.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
		if err != nil {
			t.Errorf("GetParameter %s: %v", name, err)
			continue
		}
		if out.Parameter.Type != ssmtypes.ParameterTypeSecureString || aws.ToString(out.Parameter.Value) != want {
			t.Errorf("parameter %s: type %s, value %q; want SecureString %q",
				name, out.Parameter.Type, aws.ToString(out.Parameter.Value), want)
		}
	}
}

// TestLocalStackHookWithoutBinary: a hook that cannot find lakeshore says how
// to build it and fails, so LocalStack marks the script as ERROR.
func TestLocalStackHookWithoutBinary(t *testing.T) {
	env := append(emulatorEnv("http://127.0.0.1:1"), "LAKESHORE_BIN="+filepath.Join(t.TempDir(), "lakeshore"))
	_, stderr, err := runWithEnv(t, env, hookScript)
	if err == nil {
		t.Fatalf("hook succeeded without a lakeshore binary; stderr:\n%s", stderr)
	}
	if !strings.Contains(stderr, "make build") {
		t.Errorf("stderr does not say to run make build:\n%s", stderr)
	}
}

// TestLakeshoreTables runs `lakeshore tables` against moto_server (or
// LAKESHORE_TEST_AWS_ENDPOINT) twice, then without a region.
func TestLakeshoreTables(t *testing.T) {
	endpoint := storetest.MotoEndpoint(t)
	prefix := storetest.Prefix(t)
	env := emulatorEnv(endpoint)
	for run, want := range []string{"created", "present"} {
		stdout, stderr, err := runWithEnv(t, env, lakeshoreBin(t), "tables", "--table-prefix", prefix)
		if err != nil {
			t.Fatalf("lakeshore tables (run %d): %v\n%s", run+1, err, stderr)
		}
		wantTableStates(t, stdout, prefix, want)
	}
	checkTemplateTables(t, endpoint, prefix)

	noRegion := append(env, "AWS_REGION=", "AWS_DEFAULT_REGION=",
		"AWS_CONFIG_FILE="+filepath.Join(t.TempDir(), "none"),
		"AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(t.TempDir(), "none"))
	_, stderr, err := runWithEnv(t, noRegion, lakeshoreBin(t), "tables", "--table-prefix", prefix)
	if err == nil || !strings.Contains(stderr, "no AWS region: set AWS_REGION") {
		t.Errorf("lakeshore tables without a region: err %v, stderr %q; want a failure naming AWS_REGION", err, stderr)
	}
}

// TestLocalStackCompose checks localstack/docker-compose.yml: with `docker
// compose config` where Docker Compose is installed, and always by reading
// it: a pinned image, the port on loopback only, the auth token required,
// the hook directory and the lakeshore binary mounted where the hook looks.
func TestLocalStackCompose(t *testing.T) {
	t.Run("docker compose config", func(t *testing.T) {
		if err := exec.Command("docker", "compose", "version").Run(); err != nil {
			t.Skipf("docker compose is not available here (%v): checking the file by reading it only", err)
		}
		// config needs the mounted binary's path only as a string.
		env := []string{"LOCALSTACK_AUTH_TOKEN=test-token"}
		if _, stderr, err := runWithEnv(t, env, "docker", "compose", "-f", composeFile, "config", "-q"); err != nil {
			t.Fatalf("docker compose config: %v\n%s", err, stderr)
		}
		_, stderr, err := runWithEnv(t, []string{"LOCALSTACK_AUTH_TOKEN="}, "docker", "compose", "-f", composeFile, "config", "-q")
		if err == nil || !strings.Contains(stderr, "LOCALSTACK_AUTH_TOKEN") {
			t.Errorf("docker compose config without LOCALSTACK_AUTH_TOKEN: err %v, stderr %q; want a failure naming it", err, stderr)
		}
	})

	raw, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	// goformation's YAML reader (yaml.v3 underneath, no intrinsics processed
	// with NoProcess) keeps the module's dependencies as they are. Its tag
	// registration writes a package-level map, so let schema's one parse of
	// template.yaml finish first: nothing in this binary parses YAML after.
	if _, err := schema.TableDefinitions("x-"); err != nil {
		t.Fatal(err)
	}
	js, err := intrinsics.ProcessYAML(raw, &intrinsics.ProcessorOptions{NoProcess: true})
	if err != nil {
		t.Fatalf("parse %s: %v", composeFile, err)
	}
	var compose struct {
		Services map[string]struct {
			Image       string            `json:"image"`
			Ports       []string          `json:"ports"`
			Environment map[string]string `json:"environment"`
			Volumes     []struct {
				Type     string `json:"type"`
				Source   string `json:"source"`
				Target   string `json:"target"`
				ReadOnly bool   `json:"read_only"`
				Bind     struct {
					CreateHostPath *bool `json:"create_host_path"`
				} `json:"bind"`
			} `json:"volumes"`
			Healthcheck struct {
				Test []string `json:"test"`
			} `json:"healthcheck"`
		} `json:"services"`
	}
	if err := json.Unmarshal(js, &compose); err != nil {
		t.Fatalf("%s: %v\n%s", composeFile, err, js)
	}
	ls, ok := compose.Services["localstack"]
	if !ok {
		t.Fatalf("%s: no localstack service", composeFile)
	}

	repo, tag, _ := strings.Cut(ls.Image, ":")
	if repo != "localstack/localstack" || !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(tag) {
		t.Errorf("image %q: want localstack/localstack pinned to a full version (YYYY.MM.patch), never latest", ls.Image)
	}
	if !slices.Equal(ls.Ports, []string{"127.0.0.1:4566:4566"}) {
		t.Errorf("ports %q: want only 127.0.0.1:4566:4566 (loopback: the emulator takes any credentials)", ls.Ports)
	}

	env := ls.Environment
	if v := env["LOCALSTACK_AUTH_TOKEN"]; !strings.HasPrefix(v, "${LOCALSTACK_AUTH_TOKEN:?") {
		t.Errorf("LOCALSTACK_AUTH_TOKEN = %q: want it passed through and required (${LOCALSTACK_AUTH_TOKEN:?…})", v)
	}
	services := strings.Split(env["SERVICES"], ",")
	for _, s := range []string{"dynamodb", "ssm", "ec2"} {
		if !slices.Contains(services, s) {
			t.Errorf("SERVICES %q lacks %s", env["SERVICES"], s)
		}
	}
	if slices.Contains(services, "lambda") {
		t.Errorf("SERVICES %q: lambda is not needed (and pulls in Docker-in-Docker)", env["SERVICES"])
	}
	if !strings.Contains(env["LAKESHORE_TABLE_PREFIX"], "LAKESHORE_TABLE_PREFIX") {
		t.Errorf("LAKESHORE_TABLE_PREFIX = %q: want it passed through from the host", env["LAKESHORE_TABLE_PREFIX"])
	}

	binTarget := env["LAKESHORE_BIN"]
	var hooks, binary bool
	for _, v := range ls.Volumes {
		switch v.Target {
		case "/etc/localstack/init/ready.d":
			hooks = true
			if _, err := os.Stat(filepath.Join(filepath.Dir(composeFile), v.Source, filepath.Base(hookScript))); err != nil {
				t.Errorf("ready.d mount source %q does not hold the hook: %v", v.Source, err)
			}
		case binTarget:
			binary = true
			if !v.ReadOnly || v.Type != "bind" || v.Bind.CreateHostPath == nil || *v.Bind.CreateHostPath {
				t.Errorf("lakeshore binary mount %+v: want a read-only bind that never creates its source", v)
			}
			if !strings.Contains(v.Source, "../bin/lakeshore") {
				t.Errorf("lakeshore binary mount source %q: want ../bin/lakeshore (make build) by default", v.Source)
			}
		}
	}
	if !hooks {
		t.Errorf("no volume mounts the hooks on /etc/localstack/init/ready.d")
	}
	if binTarget == "" || !binary {
		t.Errorf("LAKESHORE_BIN = %q: want it set to the target of the lakeshore binary mount", binTarget)
	}
	if !strings.Contains(strings.Join(ls.Healthcheck.Test, " "), "/_localstack/health") {
		t.Errorf("healthcheck %q does not ask /_localstack/health", ls.Healthcheck.Test)
	}

	// The hook: executable, bash, valid syntax, and its default binary is
	// where the compose file mounts it.
	fi, err := os.Stat(hookScript)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o111 != 0o111 {
		t.Errorf("%s is %v: LocalStack runs only executable scripts", hookScript, fi.Mode().Perm())
	}
	script, err := os.ReadFile(hookScript)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(script, []byte("#!/usr/bin/env bash\n")) {
		t.Errorf("%s must start with a bash shebang", hookScript)
	}
	if !bytes.Contains(script, []byte("${LAKESHORE_BIN:-"+binTarget+"}")) {
		t.Errorf("%s does not default LAKESHORE_BIN to the mount target %s", hookScript, binTarget)
	}
	if out, err := exec.Command("bash", "-n", hookScript).CombinedOutput(); err != nil {
		t.Errorf("bash -n %s: %v\n%s", hookScript, err, out)
	}
}
