// Package config reads the control plane's configuration in Lambda mode
// (docs/design.md §8): table prefix, tokens (from the environment or from SSM
// SecureString parameters) and the stale window. It refuses to start without
// tokens: a control plane never runs open.
package config

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dreamlake/lakeshore/shared/api"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/lambdahttp"
	"github.com/dreamlake/lakeshore/shared/reaper"
	"github.com/dreamlake/lakeshore/shared/store"
)

// Environment variable names.
const (
	EnvTablePrefix   = "LAKESHORE_TABLE_PREFIX"
	EnvEnrollToken   = "LAKESHORE_ENROLL_TOKEN"
	EnvOperatorToken = "LAKESHORE_OPERATOR_TOKEN"
	EnvStaleAfter    = "LAKESHORE_STALE_AFTER"
	EnvDaemonAuth    = "LAKESHORE_DAEMON_AUTH" // token (default) or iam
	paramSuffix      = "_PARAM"                // names an SSM SecureString holding the value
	DefaultPrefix    = "lakeshore-"
)

// Config is the control plane's configuration.
type Config struct {
	TablePrefix   string
	EnrollToken   string
	OperatorToken string
	StaleAfter    time.Duration
	// DaemonAuth is how daemon routes authenticate: "token" or "iam"
	// (api.DaemonAuthToken, api.DaemonAuthIAM).
	DaemonAuth string
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
		name string
		dst  *string
	}{{EnvEnrollToken, &c.EnrollToken}, {EnvOperatorToken, &c.OperatorToken}} {
		v, err := secret(ctx, getenv, params, s.name)
		if err != nil {
			return Config{}, err
		}
		*s.dst = v
	}
	c.DaemonAuth = getenv(EnvDaemonAuth)
	switch c.DaemonAuth {
	case "":
		c.DaemonAuth = api.DaemonAuthToken
	case api.DaemonAuthToken, api.DaemonAuthIAM:
	default:
		return Config{}, fmt.Errorf("%s must be %s or %s, got %q", EnvDaemonAuth, api.DaemonAuthToken, api.DaemonAuthIAM, c.DaemonAuth)
	}
	return c, nil
}

// LoadStore reads what a function that serves no routes needs (the reaper,
// the host poller): the table prefix and the stale window. Tokens stay unset.
func LoadStore(getenv func(string) string) (Config, error) {
	c := Config{TablePrefix: getenv(EnvTablePrefix), StaleAfter: domain.DefaultStaleAfter}
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

// Router builds the control plane's HTTP router from the process
// environment and the standard AWS SDK configuration: what every Lambda
// main runs.
func Router(ctx context.Context) (*api.Server, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS config: %w", err)
	}
	c, err := Load(ctx, os.Getenv, ssm.NewFromConfig(awsCfg))
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	return api.New(api.Config{
		Store:         store.New(dynamodb.NewFromConfig(awsCfg), c.TablePrefix),
		EnrollToken:   c.EnrollToken,
		OperatorToken: c.OperatorToken,
		StaleAfter:    c.StaleAfter,
		DaemonAuth:    c.DaemonAuth,
		Logger:        log,
	})
}

// RunLambda is the whole main of a route-group Lambda: build the router from
// the environment and serve API Gateway events with it. It exits 1 when the
// configuration is incomplete, so a misconfigured deploy fails its INIT.
func RunLambda(name string) {
	router, err := Router(context.Background())
	if err != nil {
		slog.Error(name+": start", "error", err.Error())
		os.Exit(1)
	}
	lambdahttp.Start(router)
}

// OpenStore is the start of every Lambda that serves no routes (the reaper,
// the host poller): the table prefix and stale window from the environment,
// the standard AWS configuration, and a store over it. It exits 1 on a bad
// configuration, so a misconfigured deploy fails its INIT.
func OpenStore(name string, log *slog.Logger) (*store.Store, aws.Config, Config) {
	c, err := LoadStore(os.Getenv)
	if err != nil {
		log.Error(name+": start", "error", err.Error())
		os.Exit(1)
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(context.Background())
	if err != nil {
		log.Error(name+": load AWS config", "error", err.Error())
		os.Exit(1)
	}
	return store.New(dynamodb.NewFromConfig(awsCfg), c.TablePrefix), awsCfg, c
}

// RunReaper is the whole main of the reaper Lambda: one sweep per scheduled
// event.
func RunReaper() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	st, _, c := OpenStore("reaper", log)
	lambda.Start(reaper.Handler(st, c.StaleAfter, log))
}
