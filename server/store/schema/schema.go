// Package schema creates the control plane's DynamoDB tables from
// template.yaml, the one schema source. It is used by `lakeshore dev` and the
// tests; the Lambdas never create tables (and never link the template parser).
package schema

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/awslabs/goformation/v7"
	cfndynamodb "github.com/awslabs/goformation/v7/cloudformation/dynamodb"
	"github.com/awslabs/goformation/v7/intrinsics"

	"github.com/dreamlake/lakeshore"
)

// prefixParameter is the template parameter every TableName is built from,
// as !Sub "${TablePrefix}<suffix>".
const prefixParameter = "TablePrefix"

// prefixSentinel stands in for the TablePrefix parameter while the template
// is parsed, so the suffix can be cut off the resolved TableName.
const prefixSentinel = "@@LAKESHORE_TABLE_PREFIX@@"

// tableSpec is one AWS::DynamoDB::Table of template.yaml.
type tableSpec struct {
	logicalID string
	suffix    string
	table     *cfndynamodb.Table
}

// specs parses the embedded template once. goformation's YAML tag handling
// writes a package-level map, so parsing must not run concurrently; parsing
// once also keeps EnsureTables and TableDefinitions cheap.
var specs = sync.OnceValues(func() ([]tableSpec, error) {
	return parseSpecs(lakeshore.Template)
})

// parseSpecs extracts the DynamoDB tables of a SAM/CloudFormation template.
func parseSpecs(template []byte) ([]tableSpec, error) {
	tmpl, err := goformation.ParseYAMLWithOptions(template, &intrinsics.ProcessorOptions{
		ParameterOverrides: map[string]interface{}{prefixParameter: prefixSentinel},
	})
	if err != nil {
		return nil, fmt.Errorf("parse template.yaml: %w", err)
	}
	tables := tmpl.GetAllDynamoDBTableResources()
	if len(tables) == 0 {
		return nil, errors.New("parse template.yaml: no AWS::DynamoDB::Table resources")
	}
	out := make([]tableSpec, 0, len(tables))
	for id, t := range tables {
		name := aws.ToString(t.TableName)
		suffix, ok := strings.CutPrefix(name, prefixSentinel)
		if !ok || suffix == "" || strings.Contains(suffix, prefixSentinel) {
			return nil, fmt.Errorf("template.yaml table %s: TableName must be !Sub \"${%s}<suffix>\", got %q",
				id, prefixParameter, strings.ReplaceAll(name, prefixSentinel, "${"+prefixParameter+"}"))
		}
		out = append(out, tableSpec{logicalID: id, suffix: suffix, table: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].suffix < out[j].suffix })
	return out, nil
}

// Suffixes reports the name suffix of every table of template.yaml
// ("workers", "invocations", …), sorted: a table's name is the table prefix
// followed by one of them. Whatever must cover every table (a test's
// snapshot of the store) lists them from here, so a table added to the
// template is covered without another list to update.
func Suffixes() ([]string, error) {
	all, err := specs()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(all))
	for _, s := range all {
		out = append(out, s.suffix)
	}
	return out, nil
}

// TableDefinitions returns every table of template.yaml as a CreateTableInput
// for the given table prefix: key schema, attribute definitions, billing mode
// and secondary indexes with their projections. Time to live is not part of
// CreateTable; EnsureTables applies it. Each call returns fresh values that
// the caller may modify.
func TableDefinitions(prefix string) ([]*dynamodb.CreateTableInput, error) {
	all, err := specs()
	if err != nil {
		return nil, err
	}
	out := make([]*dynamodb.CreateTableInput, 0, len(all))
	for _, s := range all {
		in, err := createTableInput(prefix+s.suffix, s.table)
		if err != nil {
			return nil, fmt.Errorf("template.yaml table %s: %w", s.logicalID, err)
		}
		out = append(out, in)
	}
	return out, nil
}

// createTableInput converts one CloudFormation table to a CreateTableInput.
func createTableInput(name string, t *cfndynamodb.Table) (*dynamodb.CreateTableInput, error) {
	in := &dynamodb.CreateTableInput{TableName: aws.String(name)}

	billing := aws.ToString(t.BillingMode)
	if billing == "" {
		billing = string(types.BillingModeProvisioned) // CloudFormation's default
	}
	in.BillingMode = types.BillingMode(billing)
	if in.BillingMode == types.BillingModeProvisioned {
		if t.ProvisionedThroughput == nil {
			return nil, errors.New("billing mode PROVISIONED needs ProvisionedThroughput")
		}
		in.ProvisionedThroughput = throughput(t.ProvisionedThroughput)
	}

	for _, a := range t.AttributeDefinitions {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
			AttributeName: aws.String(a.AttributeName),
			AttributeType: types.ScalarAttributeType(a.AttributeType),
		})
	}
	if len(t.KeySchema) == 0 {
		return nil, errors.New("no KeySchema")
	}
	in.KeySchema = keySchema(t.KeySchema)

	for _, g := range t.GlobalSecondaryIndexes {
		gsi := types.GlobalSecondaryIndex{
			IndexName:  aws.String(g.IndexName),
			KeySchema:  keySchema(g.KeySchema),
			Projection: projection(g.Projection),
		}
		if in.BillingMode == types.BillingModeProvisioned {
			if g.ProvisionedThroughput == nil {
				return nil, fmt.Errorf("index %s: billing mode PROVISIONED needs ProvisionedThroughput", g.IndexName)
			}
			gsi.ProvisionedThroughput = throughput(g.ProvisionedThroughput)
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, gsi)
	}
	for _, l := range t.LocalSecondaryIndexes {
		in.LocalSecondaryIndexes = append(in.LocalSecondaryIndexes, types.LocalSecondaryIndex{
			IndexName:  aws.String(l.IndexName),
			KeySchema:  keySchema(l.KeySchema),
			Projection: projection(l.Projection),
		})
	}
	return in, nil
}

func keySchema(ks []cfndynamodb.Table_KeySchema) []types.KeySchemaElement {
	out := make([]types.KeySchemaElement, 0, len(ks))
	for _, k := range ks {
		out = append(out, types.KeySchemaElement{
			AttributeName: aws.String(k.AttributeName),
			KeyType:       types.KeyType(k.KeyType),
		})
	}
	return out
}

func projection(p *cfndynamodb.Table_Projection) *types.Projection {
	if p == nil {
		// CloudFormation requires a Projection; DynamoDB's default is KEYS_ONLY.
		return &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
	}
	out := &types.Projection{ProjectionType: types.ProjectionType(aws.ToString(p.ProjectionType))}
	if out.ProjectionType == "" {
		out.ProjectionType = types.ProjectionTypeKeysOnly
	}
	if len(p.NonKeyAttributes) > 0 {
		out.NonKeyAttributes = append([]string(nil), p.NonKeyAttributes...)
	}
	return out
}

func throughput(p *cfndynamodb.Table_ProvisionedThroughput) *types.ProvisionedThroughput {
	return &types.ProvisionedThroughput{
		ReadCapacityUnits:  aws.Int64(int64(p.ReadCapacityUnits)),
		WriteCapacityUnits: aws.Int64(int64(p.WriteCapacityUnits)),
	}
}

// ttlAttribute returns the TTL attribute a table declares, or "".
func ttlAttribute(t *cfndynamodb.Table) string {
	if t.TimeToLiveSpecification == nil || !t.TimeToLiveSpecification.Enabled {
		return ""
	}
	return aws.ToString(t.TimeToLiveSpecification.AttributeName)
}

// SchemaAPI is the part of the DynamoDB API that EnsureTables uses;
// *dynamodb.Client implements it.
type SchemaAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// tableActiveTimeout bounds the wait for one table to become ACTIVE. Real
// DynamoDB usually needs seconds; emulators answer at once.
const tableActiveTimeout = 3 * time.Minute

// EnsureTables creates every table of template.yaml under the given prefix
// that does not exist yet, waits until each is ACTIVE, and enables time to
// live where the template declares it. It is idempotent: existing tables are
// left as they are (their schema is not compared or migrated).
func EnsureTables(ctx context.Context, api SchemaAPI, prefix string) error {
	all, err := specs()
	if err != nil {
		return err
	}
	// Create everything first, then wait: on real DynamoDB the tables then
	// become ACTIVE in parallel.
	for _, s := range all {
		name := prefix + s.suffix
		in, err := createTableInput(name, s.table)
		if err != nil {
			return fmt.Errorf("template.yaml table %s: %w", s.logicalID, err)
		}
		if _, err := api.CreateTable(ctx, in); err != nil {
			if _, ok := errors.AsType[*types.ResourceInUseException](err); !ok {
				return fmt.Errorf("create table %s: %w", name, err)
			}
		}
	}
	for _, s := range all {
		name := prefix + s.suffix
		if err := waitActive(ctx, api, name); err != nil {
			return err
		}
		if attr := ttlAttribute(s.table); attr != "" {
			if err := enableTTL(ctx, api, name, attr); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitActive polls DescribeTable until the table and its global secondary
// indexes are ACTIVE, for at most tableActiveTimeout.
func waitActive(ctx context.Context, api SchemaAPI, name string) error {
	ctx, cancel := context.WithTimeout(ctx, tableActiveTimeout)
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		out, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		switch _, notFound := errors.AsType[*types.ResourceNotFoundException](err); {
		case err == nil:
			if tableReady(out.Table) {
				return nil
			}
		case notFound:
			// Eventually consistent right after CreateTable: keep polling.
		default:
			return fmt.Errorf("describe table %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for table %s to become ACTIVE: %w", name, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// tableReady reports whether a described table can take traffic. minidyn
// v0.8.2 leaves TableStatus empty (it has no lifecycle: a table is usable as
// soon as CreateTable returns), so an empty status counts as ready; so does
// an empty index status.
func tableReady(t *types.TableDescription) bool {
	if t == nil {
		return false
	}
	if t.TableStatus != "" && t.TableStatus != types.TableStatusActive {
		return false
	}
	for _, g := range t.GlobalSecondaryIndexes {
		if g.IndexStatus != "" && g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}

// enableTTL turns on time to live for attr. Emulator differences:
//   - Real DynamoDB rejects enabling TTL that is already enabled with a
//     ValidationException ("TimeToLive is already enabled"): that is success.
//   - moto 5 accepts UpdateTimeToLive (repeatedly) and records it, but never
//     expires items.
//   - minidyn v0.8.2's HTTP server does not implement UpdateTimeToLive at all:
//     it answers HTTP 400 with the plain-text body "unsupported operation",
//     which the SDK reports as a *smithy.DeserializationError (not an API
//     error) whose Snapshot is that body. minidyn never expires items either.
//     The store must not rely on TTL for correctness anyway (expiry is
//     best-effort cleanup, up to days late on AWS), so an emulator without
//     TTL is skipped rather than failed.
func enableTTL(ctx context.Context, api SchemaAPI, name, attr string) error {
	_, err := api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(attr),
			Enabled:       aws.Bool(true),
		},
	})
	if err == nil || ttlAlreadyEnabled(err) || ttlUnsupported(err) {
		return nil
	}
	return fmt.Errorf("enable time to live on %s.%s: %w", name, attr, err)
}

func ttlAlreadyEnabled(err error) bool {
	apiErr, ok := errors.AsType[smithy.APIError](err)
	return ok &&
		apiErr.ErrorCode() == "ValidationException" &&
		strings.Contains(strings.ToLower(apiErr.ErrorMessage()), "already enabled")
}

// ttlUnsupported reports whether err says the endpoint does not implement
// UpdateTimeToLive (an emulator, never real DynamoDB).
func ttlUnsupported(err error) bool {
	// minidyn's server: HTTP 400, body "unsupported operation" (not JSON).
	if de, ok := errors.AsType[*smithy.DeserializationError](err); ok &&
		bytes.Contains(bytes.ToLower(de.Snapshot), []byte("unsupported operation")) {
		return true
	}
	if apiErr, ok := errors.AsType[smithy.APIError](err); ok {
		switch apiErr.ErrorCode() {
		case "UnknownOperationException", "NotImplementedException", "NotImplemented":
			return true
		}
		if strings.Contains(strings.ToLower(apiErr.ErrorMessage()), "unsupported operation") {
			return true
		}
	}
	respErr, ok := errors.AsType[*smithyhttp.ResponseError](err)
	return ok && respErr.HTTPStatusCode() == http.StatusNotImplemented
}
