package schema

import (
	"context"
	"errors"
	"github.com/dreamlake/lakeshore/server/store"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// wantTable is the expected shape of one table of template.yaml.
type wantTable struct {
	hash, rng string
	gsis      map[string][2]string // index name -> hash, range
	// keysOnly names the indexes that project keys only (the others
	// project ALL).
	keysOnly map[string]bool
	// numbers names the key attributes of type N (the others are S).
	numbers map[string]bool
	ttl     string
}

func wantSchema(n store.TableNames) map[string]wantTable {
	return map[string]wantTable{
		n.Workers: {hash: "worker_id", ttl: "expires_at",
			gsis:     map[string][2]string{"roster": {"roster", "roster_until"}},
			keysOnly: map[string]bool{"roster": true}},
		n.Machines: {hash: "machine_id"},
		n.Invocations: {
			hash: "invocation_id",
			gsis: map[string][2]string{
				"claim":       {"claim_key", "invocation_id"},
				"holder":      {"holder", "invocation_id"},
				"queue":       {"queue", "invocation_id"},
				"queue_state": {"queue_state", "invocation_id"},
			},
			ttl: "expires_at",
		},
		n.Commands:    {hash: "worker_id", rng: "command_id"},
		n.Queues:      {hash: "queue", gsis: map[string][2]string{"listing": {"listing", "listed"}}},
		n.Idempotency: {hash: "idempotency_key", ttl: "expires_at"},
		n.Connections: {hash: "wake_key", rng: "connection_id", ttl: "expires_at",
			gsis:    map[string][2]string{"live": {"wake_key", "expires_at"}},
			numbers: map[string]bool{"expires_at": true}},
		n.Logs:  {hash: "log_key", rng: "seq", ttl: "expires_at"},
		n.Hosts: {hash: "host_id", ttl: "expires_at"},
	}
}

func TestNamesFor(t *testing.T) {
	got := store.NamesFor("lakeshore-")
	want := store.TableNames{
		Workers:     "lakeshore-workers",
		Machines:    "lakeshore-machines",
		Invocations: "lakeshore-invocations",
		Commands:    "lakeshore-commands",
		Queues:      "lakeshore-queues",
		Idempotency: "lakeshore-idempotency",
		Connections: "lakeshore-connections",
		Logs:        "lakeshore-logs",
		Hosts:       "lakeshore-hosts",
	}
	if got != want {
		t.Fatalf("store.NamesFor = %+v, want %+v", got, want)
	}
}

// TestSuffixesAreTheStoresTables: the tables of template.yaml (Suffixes,
// which the test snapshot of the store lists) are exactly the fields of
// store.TableNames, so a table added on one side only fails here.
func TestSuffixesAreTheStoresTables(t *testing.T) {
	got, err := Suffixes()
	if err != nil {
		t.Fatal(err)
	}
	names := reflect.ValueOf(store.NamesFor(""))
	var want []string
	for i := range names.NumField() {
		want = append(want, names.Field(i).String())
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Suffixes() = %v, want the fields of store.TableNames %v", got, want)
	}
}

func TestTableDefinitionsMatchSchema(t *testing.T) {
	const prefix = "test-"
	defs, err := TableDefinitions(prefix)
	if err != nil {
		t.Fatal(err)
	}
	want := wantSchema(store.NamesFor(prefix))
	// Each index projects ALL but these (table suffix/index): the
	// invocations' listing indexes hold small entries (docs/cost.md).
	projections := map[string]types.Projection{
		store.InvocationsSuffix + "/queue": {ProjectionType: types.ProjectionTypeKeysOnly},
		store.InvocationsSuffix + "/queue_state": {ProjectionType: types.ProjectionTypeInclude,
			NonKeyAttributes: []string{"host_key", "retry_at", "run_id", "created_at"}},
	}

	var gotNames, wantNames []string
	for _, d := range defs {
		gotNames = append(gotNames, aws.ToString(d.TableName))
	}
	for name := range want {
		wantNames = append(wantNames, name)
	}
	sort.Strings(gotNames)
	sort.Strings(wantNames)
	if !slices.Equal(gotNames, wantNames) {
		t.Fatalf("tables = %v, want %v", gotNames, wantNames)
	}

	for _, d := range defs {
		name := aws.ToString(d.TableName)
		w := want[name]
		t.Run(name, func(t *testing.T) {
			if d.BillingMode != types.BillingModePayPerRequest {
				t.Errorf("billing mode = %q, want PAY_PER_REQUEST", d.BillingMode)
			}
			if d.ProvisionedThroughput != nil {
				t.Errorf("provisioned throughput set on an on-demand table")
			}
			if h, r := keys(d.KeySchema); h != w.hash || r != w.rng {
				t.Errorf("key = (%q, %q), want (%q, %q)", h, r, w.hash, w.rng)
			}

			gotGSIs := map[string][2]string{}
			for _, g := range d.GlobalSecondaryIndexes {
				h, r := keys(g.KeySchema)
				gotGSIs[aws.ToString(g.IndexName)] = [2]string{h, r}
				wantP, ok := projections[strings.TrimPrefix(name, prefix)+"/"+aws.ToString(g.IndexName)]
				switch {
				case ok:
				case w.keysOnly[aws.ToString(g.IndexName)]:
					wantP = types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
				default:
					wantP = types.Projection{ProjectionType: types.ProjectionTypeAll}
				}
				if g.Projection == nil || !reflect.DeepEqual(*g.Projection, wantP) {
					t.Errorf("index %s: projection = %+v, want %+v", aws.ToString(g.IndexName), g.Projection, wantP)
				}
				if g.ProvisionedThroughput != nil {
					t.Errorf("index %s: provisioned throughput set on an on-demand table", aws.ToString(g.IndexName))
				}
			}
			if len(w.gsis) == 0 {
				w.gsis = map[string][2]string{}
			}
			if !reflect.DeepEqual(gotGSIs, w.gsis) {
				t.Errorf("GSIs = %v, want %v", gotGSIs, w.gsis)
			}
			if len(d.LocalSecondaryIndexes) != 0 {
				t.Errorf("unexpected LSIs: %v", d.LocalSecondaryIndexes)
			}

			// DynamoDB wants exactly the key attributes defined: S here,
			// but for the numbers named.
			used := map[string]bool{}
			for _, k := range d.KeySchema {
				used[aws.ToString(k.AttributeName)] = true
			}
			for _, g := range d.GlobalSecondaryIndexes {
				for _, k := range g.KeySchema {
					used[aws.ToString(k.AttributeName)] = true
				}
			}
			defined := map[string]bool{}
			for _, a := range d.AttributeDefinitions {
				defined[aws.ToString(a.AttributeName)] = true
				wantType := types.ScalarAttributeTypeS
				if w.numbers[aws.ToString(a.AttributeName)] {
					wantType = types.ScalarAttributeTypeN
				}
				if a.AttributeType != wantType {
					t.Errorf("attribute %s: type %q, want %s", aws.ToString(a.AttributeName), a.AttributeType, wantType)
				}
			}
			if !reflect.DeepEqual(used, defined) {
				t.Errorf("attribute definitions %v, key attributes %v", defined, used)
			}
		})
	}
}

func TestTemplateTTL(t *testing.T) {
	all, err := specs()
	if err != nil {
		t.Fatal(err)
	}
	want := wantSchema(store.NamesFor(""))
	for _, s := range all {
		if got := ttlAttribute(s.table); got != want[s.suffix].ttl {
			t.Errorf("table %s: TTL attribute %q, want %q", s.suffix, got, want[s.suffix].ttl)
		}
	}
}

func TestTableDefinitionsAreFresh(t *testing.T) {
	a, err := TableDefinitions("a-")
	if err != nil {
		t.Fatal(err)
	}
	a[0].TableName = aws.String("changed")
	a[0].KeySchema[0].AttributeName = aws.String("changed")
	b, err := TableDefinitions("a-")
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(b[0].TableName) == "changed" || aws.ToString(b[0].KeySchema[0].AttributeName) == "changed" {
		t.Fatal("TableDefinitions returned shared values")
	}
}

func TestParseSpecsRejectsFixedTableName(t *testing.T) {
	tmpl := []byte(`
Parameters:
  TablePrefix:
    Type: String
    Default: x-
Resources:
  T:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: fixed-name
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: id, AttributeType: S}]
      KeySchema: [{AttributeName: id, KeyType: HASH}]
`)
	_, err := parseSpecs(tmpl)
	if err == nil || !strings.Contains(err.Error(), "TablePrefix") {
		t.Fatalf("parseSpecs = %v, want an error about TablePrefix", err)
	}
}

func keys(ks []types.KeySchemaElement) (hash, rng string) {
	for _, k := range ks {
		switch k.KeyType {
		case types.KeyTypeHash:
			hash = aws.ToString(k.AttributeName)
		case types.KeyTypeRange:
			rng = aws.ToString(k.AttributeName)
		}
	}
	return hash, rng
}

// fakeSchemaAPI records calls and replays scripted answers.
type fakeSchemaAPI struct {
	existing  map[string]bool
	describes map[string]int // DescribeTable calls per table
	creating  int            // DescribeTable answers CREATING this many times
	ttlErr    error
	ttl       []string
}

func (f *fakeSchemaAPI) CreateTable(_ context.Context, in *dynamodb.CreateTableInput, _ ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error) {
	name := aws.ToString(in.TableName)
	if f.existing[name] {
		return nil, &types.ResourceInUseException{Message: aws.String("exists")}
	}
	f.existing[name] = true
	return &dynamodb.CreateTableOutput{}, nil
}

func (f *fakeSchemaAPI) DescribeTable(_ context.Context, in *dynamodb.DescribeTableInput, _ ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	name := aws.ToString(in.TableName)
	f.describes[name]++
	status := types.TableStatusActive
	if f.describes[name] <= f.creating {
		status = types.TableStatusCreating
	}
	return &dynamodb.DescribeTableOutput{Table: &types.TableDescription{TableName: in.TableName, TableStatus: status}}, nil
}

func (f *fakeSchemaAPI) UpdateTimeToLive(_ context.Context, in *dynamodb.UpdateTimeToLiveInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error) {
	f.ttl = append(f.ttl, aws.ToString(in.TableName)+"."+aws.ToString(in.TimeToLiveSpecification.AttributeName))
	return &dynamodb.UpdateTimeToLiveOutput{}, f.ttlErr
}

func newFake() *fakeSchemaAPI {
	return &fakeSchemaAPI{existing: map[string]bool{}, describes: map[string]int{}}
}

func TestEnsureTablesWithFake(t *testing.T) {
	ctx := context.Background()
	n := store.NamesFor("p-")
	f := newFake()
	f.existing[n.Workers] = true // ResourceInUse is fine
	f.creating = 1               // wait through CREATING
	if err := EnsureTables(ctx, f, "p-"); err != nil {
		t.Fatal(err)
	}
	if len(f.existing) != 9 {
		t.Errorf("tables = %v, want 9", f.existing)
	}
	for name, calls := range f.describes {
		if calls != 2 {
			t.Errorf("%s: %d DescribeTable calls, want 2", name, calls)
		}
	}
	sort.Strings(f.ttl)
	wantTTL := []string{n.Connections + ".expires_at", n.Hosts + ".expires_at", n.Idempotency + ".expires_at", n.Invocations + ".expires_at", n.Logs + ".expires_at", n.Workers + ".expires_at"}
	if !slices.Equal(f.ttl, wantTTL) {
		t.Errorf("TTL enabled on %v, want %v", f.ttl, wantTTL)
	}

	// Second run: everything exists, TTL "already enabled" is success.
	f.creating = 0
	f.ttlErr = &smithy.GenericAPIError{Code: "ValidationException", Message: "TimeToLive is already enabled"}
	if err := EnsureTables(ctx, f, "p-"); err != nil {
		t.Fatalf("second EnsureTables: %v", err)
	}

	// Any other TTL error is reported, with context.
	f.ttlErr = &smithy.GenericAPIError{Code: "AccessDeniedException", Message: "no"}
	err := EnsureTables(ctx, f, "p-")
	if _, ok := errors.AsType[smithy.APIError](err); !ok || !strings.Contains(err.Error(), "time to live") {
		t.Fatalf("EnsureTables with TTL failure = %v, want wrapped API error", err)
	}
}

func TestTableReady(t *testing.T) {
	active := types.IndexStatusActive
	for _, tc := range []struct {
		name string
		desc *types.TableDescription
		want bool
	}{
		{"nil", nil, false},
		{"no status (minidyn)", &types.TableDescription{}, true},
		{"active", &types.TableDescription{TableStatus: types.TableStatusActive}, true},
		{"creating", &types.TableDescription{TableStatus: types.TableStatusCreating}, false},
		{"index creating", &types.TableDescription{
			TableStatus:            types.TableStatusActive,
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndexDescription{{IndexStatus: types.IndexStatusCreating}},
		}, false},
		{"index active", &types.TableDescription{
			TableStatus:            types.TableStatusActive,
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndexDescription{{IndexStatus: active}},
		}, true},
	} {
		if got := tableReady(tc.desc); got != tc.want {
			t.Errorf("%s: tableReady = %v, want %v", tc.name, got, tc.want)
		}
	}
}
