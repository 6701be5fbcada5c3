package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// setAWSEnv points the SDK's default configuration at endpoint with dummy
// credentials, and away from the developer's AWS files and profile.
func setAWSEnv(t *testing.T, endpoint string) {
	t.Helper()
	none := filepath.Join(t.TempDir(), "none")
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL":            endpoint,
		"AWS_REGION":                  "us-east-1",
		"AWS_DEFAULT_REGION":          "",
		"AWS_ACCESS_KEY_ID":           "test",
		"AWS_SECRET_ACCESS_KEY":       "test",
		"AWS_SESSION_TOKEN":           "",
		"AWS_PROFILE":                 "",
		"AWS_CONFIG_FILE":             none,
		"AWS_SHARED_CREDENTIALS_FILE": none,
		"AWS_EC2_METADATA_DISABLED":   "true",
	} {
		t.Setenv(k, v)
	}
}

func TestTablesCreatesThenFindsEveryTable(t *testing.T) {
	setAWSEnv(t, storetest.EmbeddedEndpoint(t))
	prefix := storetest.Prefix(t)
	defs, err := schema.TableDefinitions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{tableCreated, tablePresent} {
		out, errOut, err := runCLI(t.Context(), "tables", "--table-prefix", prefix)
		if err != nil {
			t.Fatalf("lakeshore tables: %v\n%s", err, errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != len(defs) {
			t.Fatalf("lakeshore tables printed %d lines, want %d (one per table):\n%s", len(lines), len(defs), out)
		}
		for i, d := range defs {
			if f := strings.Fields(lines[i]); len(f) != 2 || f[0] != *d.TableName || f[1] != want {
				t.Errorf("line %q, want %s %s", lines[i], *d.TableName, want)
			}
		}
	}
}

func TestTablesRefusesBadConfiguration(t *testing.T) {
	endpoint := storetest.EmbeddedEndpoint(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no region", map[string]string{"AWS_REGION": ""}, nil, "no AWS region: set AWS_REGION"},
		{"no credentials", map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, nil,
			"no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"},
		{"empty prefix", nil, []string{"--table-prefix", ""}, "--table-prefix must not be empty"},
		{"zero timeout", nil, []string{"--timeout", "0s"}, "--timeout must be positive"},
		{"unreachable endpoint", map[string]string{"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}, []string{"--timeout", "5s"},
			"DynamoDB at http://127.0.0.1:1: describe table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setAWSEnv(t, endpoint)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, _, err := runCLI(t.Context(), append([]string{"tables"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("lakeshore tables: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
