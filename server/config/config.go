// Package config reads the control plane's configuration in Lambda mode
// (docs/design.md §8): table prefix, tokens (from the environment or from SSM
// SecureString parameters) and the stale window. It only reads, into a
// Config, and reports what is missing or malformed as an error: a control
// plane never runs open. What to build from a Config is each function's
// main's business (server/lambdamain, server/api/apilambda).
package config

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Environment variable names.
const (
	EnvTablePrefix   = "LAKESHORE_TABLE_PREFIX"
	EnvEnrollToken   = "LAKESHORE_ENROLL_TOKEN"
	EnvOperatorToken = "LAKESHORE_OPERATOR_TOKEN"
	// The previous tokens, still accepted during a rotation (optional;
	// docs/operations.md): their values, or their _PARAM names.
	EnvPreviousEnrollToken   = "LAKESHORE_PREVIOUS_ENROLL_TOKEN"
	EnvPreviousOperatorToken = "LAKESHORE_PREVIOUS_OPERATOR_TOKEN"
	EnvStaleAfter            = "LAKESHORE_STALE_AFTER"
	EnvDaemonAuth            = "LAKESHORE_DAEMON_AUTH" // token (default) or iam
	// The wake channel (both or neither): the WebSocket URL hello hands
	// daemons, and the https endpoint of its management API.
	EnvWakeURL      = "LAKESHORE_WAKE_URL"
	EnvWakeEndpoint = "LAKESHORE_WAKE_ENDPOINT"
	// EnvWakeSecret is sent with every management call (optional): the
	// secret of `lakeshore dev`'s emulated management API. API Gateway's
	// own checks the caller's SigV4 signature instead.
	EnvWakeSecret = "LAKESHORE_WAKE_SECRET"
	// EnvClaimShards splits each queue's claim index partition (default 1;
	// docs/dispatch.md). Every function must read the same count.
	EnvClaimShards = "LAKESHORE_CLAIM_SHARDS"
	paramSuffix    = "_PARAM" // names an SSM SecureString holding the value
	DefaultPrefix  = "lakeshore-"
	// MaxClaimShards bounds EnvClaimShards: an idle poll reads every shard.
	MaxClaimShards = 64
)

// Config is the control plane's configuration.
type Config struct {
	TablePrefix   string
	EnrollToken   string
	OperatorToken string
	// PreviousEnrollToken and PreviousOperatorToken are still accepted
	// during a rotation ("" when none).
	PreviousEnrollToken   string
	PreviousOperatorToken string
	StaleAfter            time.Duration
	// DaemonAuth is how daemon routes authenticate: "token" or "iam"
	// (auth.DaemonAuthToken, auth.DaemonAuthIAM).
	DaemonAuth string
	// WakeURL and WakeEndpoint are the wake channel's socket URL and
	// management endpoint; both empty: no wake channel.
	WakeURL      string
	WakeEndpoint string
	// WakeSecret goes with each management call ("": none; only the
	// dev server's emulation asks for one).
	WakeSecret string
	// ClaimShards is store.Store.ClaimShards (1: one partition a queue).
	ClaimShards int
}

// ParameterGetter is the SSM call the loader makes.
type ParameterGetter interface {
	GetParameter(context.Context, *ssm.GetParameterInput, ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

// Load reads the configuration from getenv, fetching <NAME>_PARAM values
// through params (which may be nil when no parameter is named).
func Load(ctx context.Context, getenv func(string) string, params ParameterGetter) (Config, error) {
	c, err := LoadStore(getenv)
	if err != nil {
		return Config{}, err
	}
	for _, s := range []struct {
		name     string
		dst      *string
		optional bool // a previous token: set only during a rotation
	}{
		{EnvEnrollToken, &c.EnrollToken, false}, {EnvOperatorToken, &c.OperatorToken, false},
		{EnvPreviousEnrollToken, &c.PreviousEnrollToken, true}, {EnvPreviousOperatorToken, &c.PreviousOperatorToken, true},
	} {
		if s.optional && getenv(s.name) == "" && getenv(s.name+paramSuffix) == "" {
			continue
		}
		v, err := secret(ctx, getenv, params, s.name)
		if err != nil {
			return Config{}, err
		}
		*s.dst = v
	}
	return c, nil
}

// LoadStore reads what a function that holds no tokens needs (the reaper,
// the host poller, the wake channel's routes): the table prefix, the stale
// window, the wake channel (they hand work back, so they wake workers) and
// the daemon auth mode (the wake routes bind a socket to its instance in
// IAM mode). Tokens stay unset.
func LoadStore(getenv func(string) string) (Config, error) {
	c := Config{TablePrefix: getenv(EnvTablePrefix), StaleAfter: domain.DefaultStaleAfter,
		WakeURL: getenv(EnvWakeURL), WakeEndpoint: getenv(EnvWakeEndpoint),
		WakeSecret: getenv(EnvWakeSecret), ClaimShards: 1}
	if v := getenv(EnvClaimShards); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxClaimShards {
			return Config{}, fmt.Errorf("%s must be a whole number from 1 to %d, got %q", EnvClaimShards, MaxClaimShards, v)
		}
		c.ClaimShards = n
	}
	c.DaemonAuth = getenv(EnvDaemonAuth)
	switch c.DaemonAuth {
	case "":
		c.DaemonAuth = auth.DaemonAuthToken
	case auth.DaemonAuthToken, auth.DaemonAuthIAM:
	default:
		return Config{}, fmt.Errorf("%s must be %s or %s, got %q", EnvDaemonAuth, auth.DaemonAuthToken, auth.DaemonAuthIAM, c.DaemonAuth)
	}
	if (c.WakeURL == "") != (c.WakeEndpoint == "") {
		return Config{}, fmt.Errorf("%s and %s must be set together (the wake channel's socket URL and its management endpoint)", EnvWakeURL, EnvWakeEndpoint)
	}
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultPrefix
	}
	if v := getenv(EnvStaleAfter); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return Config{}, fmt.Errorf("%s must be a duration of at least 1s, like 60s; got %q", EnvStaleAfter, v)
		}
		c.StaleAfter = d
	}
	return c, nil
}

func secret(ctx context.Context, getenv func(string) string, params ParameterGetter, name string) (string, error) {
	if v := getenv(name); v != "" {
		return v, nil
	}
	param := getenv(name + paramSuffix)
	if param == "" {
		return "", fmt.Errorf("%s or %s%s must be set: the control plane refuses to run without it", name, name, paramSuffix)
	}
	if params == nil {
		return "", fmt.Errorf("%s%s is set but no SSM client is available", name, paramSuffix)
	}
	out, err := params.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(param), WithDecryption: aws.Bool(true)})
	if err != nil {
		return "", fmt.Errorf("read SSM parameter %s (%s%s): %w", param, name, paramSuffix, err)
	}
	if out.Parameter == nil || aws.ToString(out.Parameter.Value) == "" {
		return "", fmt.Errorf("SSM parameter %s (%s%s) is empty", param, name, paramSuffix)
	}
	return aws.ToString(out.Parameter.Value), nil
}
