package config

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/aws-sdk-go-v2/service/ssm/types"
)

type fakeSSM map[string]string

func (f fakeSSM) GetParameter(_ context.Context, in *ssm.GetParameterInput, _ ...func(*ssm.Options)) (*ssm.GetParameterOutput, error) {
	if !aws.ToBool(in.WithDecryption) {
		return nil, errors.New("asked without decryption")
	}
	v, ok := f[aws.ToString(in.Name)]
	if !ok {
		return nil, errors.New("ParameterNotFound")
	}
	return &ssm.GetParameterOutput{Parameter: &types.Parameter{Value: aws.String(v)}}, nil
}

func TestLoad(t *testing.T) {
	params := fakeSSM{"/ls/enroll": "from-ssm"}
	cases := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{"tokens from env, defaults", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o"},
			Config{TablePrefix: DefaultPrefix, EnrollToken: "e", OperatorToken: "o", StaleAfter: 60 * time.Second, DaemonAuth: "token", ClaimShards: 1}, ""},
		{"IAM mode", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvDaemonAuth: "iam"},
			Config{TablePrefix: DefaultPrefix, EnrollToken: "e", OperatorToken: "o", StaleAfter: 60 * time.Second, DaemonAuth: "iam", ClaimShards: 1}, ""},
		{"a rotation: the previous tokens, one from SSM", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o",
			EnvPreviousEnrollToken + "_PARAM": "/ls/enroll", EnvPreviousOperatorToken: "old-o"},
			Config{TablePrefix: DefaultPrefix, EnrollToken: "e", OperatorToken: "o", PreviousEnrollToken: "from-ssm", PreviousOperatorToken: "old-o",
				StaleAfter: 60 * time.Second, DaemonAuth: "token", ClaimShards: 1}, ""},
		{"a previous token's parameter missing", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o",
			EnvPreviousEnrollToken + "_PARAM": "/ls/gone"}, Config{}, "ParameterNotFound"},
		{"unknown daemon auth", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvDaemonAuth: "IAM"}, Config{}, "LAKESHORE_DAEMON_AUTH must be token or iam"},
		{"token from SSM", map[string]string{EnvEnrollToken + "_PARAM": "/ls/enroll", EnvOperatorToken: "o", EnvTablePrefix: "p-", EnvStaleAfter: "3s"},
			Config{TablePrefix: "p-", EnrollToken: "from-ssm", OperatorToken: "o", StaleAfter: 3 * time.Second, DaemonAuth: "token", ClaimShards: 1}, ""},
		{"wake channel and shards", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvWakeURL: "wss://w/wake", EnvWakeEndpoint: "https://w/wake", EnvClaimShards: "8"},
			Config{TablePrefix: DefaultPrefix, EnrollToken: "e", OperatorToken: "o", StaleAfter: 60 * time.Second, DaemonAuth: "token",
				WakeURL: "wss://w/wake", WakeEndpoint: "https://w/wake", ClaimShards: 8}, ""},
		{"wake URL without its endpoint", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvWakeURL: "wss://w/wake"}, Config{}, "must be set together"},
		{"bad shard count", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvClaimShards: "0"}, Config{}, "LAKESHORE_CLAIM_SHARDS must be a whole number from 1 to 64"},
		{"missing token refuses", map[string]string{EnvEnrollToken: "e"}, Config{}, "LAKESHORE_OPERATOR_TOKEN or LAKESHORE_OPERATOR_TOKEN_PARAM must be set"},
		{"missing parameter", map[string]string{EnvEnrollToken + "_PARAM": "/nope", EnvOperatorToken: "o"}, Config{}, "read SSM parameter /nope"},
		{"bad stale", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvStaleAfter: "soon"}, Config{}, "LAKESHORE_STALE_AFTER must be a duration"},
		{"stale too short", map[string]string{EnvEnrollToken: "e", EnvOperatorToken: "o", EnvStaleAfter: "10ms"}, Config{}, "at least 1s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Load(context.Background(), func(k string) string { return c.env[k] }, params)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestLoadStoreNeedsNoTokens: the reaper and the host poller serve no routes
// and must start without the tokens the route Lambdas refuse to run without.
func TestLoadStoreNeedsNoTokens(t *testing.T) {
	c, err := LoadStore(func(k string) string {
		return map[string]string{EnvTablePrefix: "p-", EnvStaleAfter: "90s"}[k]
	})
	if err != nil || c.TablePrefix != "p-" || c.StaleAfter != 90*time.Second || c.EnrollToken != "" {
		t.Fatalf("LoadStore = %+v, %v", c, err)
	}
}
