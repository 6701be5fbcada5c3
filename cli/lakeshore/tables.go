package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/server/store/schema"
)

// Table states `lakeshore tables` prints next to each table name.
const (
	tableCreated = "created"
	tablePresent = "present"
)

// credentialsTimeout bounds the credential look-up before any table call. On
// a machine that is not on EC2 the SDK's last resort (the instance metadata
// service) can otherwise take a while to give up.
const credentialsTimeout = 10 * time.Second

type tablesOptions struct {
	tablePrefix string
	timeout     time.Duration
}

func newTablesCmd() *cobra.Command {
	var o tablesOptions
	cmd := &cobra.Command{
		Use:   "tables",
		Short: "Create any missing DynamoDB table from template.yaml (AWS_ENDPOINT_URL: moto, LocalStack)",
		Long: `Create every DynamoDB table of the control plane that does not exist yet,
from the template.yaml built into this binary, and print each table name with
"created" or "present". Existing tables are left as they are, so running it
again changes nothing.

It uses the standard AWS SDK configuration: AWS_REGION, credentials
(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE; any values work for
moto_server and LocalStack), and AWS_ENDPOINT_URL to point it at an emulator:

  AWS_ENDPOINT_URL=http://127.0.0.1:4566 AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test lakeshore tables

The LocalStack init hook (localstack/init/ready.d) runs this command.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTables(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tablePrefix, "table-prefix", "lakeshore-dev-", "DynamoDB table name prefix (the same default as lakeshore dev)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long (tables on real DynamoDB take seconds to become ACTIVE)")
	return cmd
}

func runTables(ctx context.Context, out io.Writer, o tablesOptions) error {
	if o.tablePrefix == "" {
		return errors.New("--table-prefix must not be empty")
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", o.timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("load AWS config: %w", err)
	}
	if err := checkAWSConfig(ctx, cfg); err != nil {
		return err
	}
	where := "DynamoDB in " + cfg.Region
	if cfg.BaseEndpoint != nil {
		where = "DynamoDB at " + aws.ToString(cfg.BaseEndpoint)
	}
	db := dynamodb.NewFromConfig(cfg)

	defs, err := schema.TableDefinitions(o.tablePrefix)
	if err != nil {
		return err
	}
	// EnsureTables does not say what it created, so look first. Another
	// process creating a table in between is harmless: it is then reported
	// as created, by one of the two.
	state := make([]string, len(defs))
	for i, d := range defs {
		name := aws.ToString(d.TableName)
		_, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: d.TableName})
		switch _, missing := errors.AsType[*types.ResourceNotFoundException](err); {
		case err == nil:
			state[i] = tablePresent
		case missing:
			state[i] = tableCreated
		default:
			return fmt.Errorf("%s: describe table %s: %w", where, name, err)
		}
	}
	if err := schema.EnsureTables(ctx, db, o.tablePrefix); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	tw := newTable(out)
	for i, d := range defs {
		fmt.Fprintf(tw, "%s\t%s\n", aws.ToString(d.TableName), state[i])
	}
	return tw.Flush()
}

// checkAWSConfig fails early, with what to set, when the SDK configuration
// has no region or no credentials: the SDK itself would only fail at the
// first call, after trying the instance metadata service.
func checkAWSConfig(ctx context.Context, cfg aws.Config) error {
	if cfg.Region == "" {
		return errors.New("no AWS region: set AWS_REGION (e.g. us-east-1; any region works for moto_server and LocalStack) or a profile with a region")
	}
	if cfg.Credentials == nil {
		return errors.New("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values, e.g. test/test, work for moto_server and LocalStack) or AWS_PROFILE")
	}
	ctx, cancel := context.WithTimeout(ctx, credentialsTimeout)
	defer cancel()
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return fmt.Errorf("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values, e.g. test/test, work for moto_server and LocalStack) or AWS_PROFILE: %w", err)
	}
	return nil
}
