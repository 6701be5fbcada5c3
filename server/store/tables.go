package store

// Table name suffixes. A table's name is the deployment's table prefix
// (LAKESHORE_TABLE_PREFIX) followed by one of these. They must match the
// TableName of the tables in template.yaml; schema_test.go checks that.
const (
	WorkersSuffix     = "workers"
	MachinesSuffix    = "machines"
	InvocationsSuffix = "invocations"
	CommandsSuffix    = "commands"
	QueuesSuffix      = "queues"
	IdempotencySuffix = "idempotency"
	ConnectionsSuffix = "connections"
	LogsSuffix        = "logs"
	HostsSuffix       = "hosts"
)

// TableNames holds the full DynamoDB table names of one deployment.
type TableNames struct {
	Workers     string
	Machines    string
	Invocations string
	Commands    string
	Queues      string
	Idempotency string
	Connections string
	Logs        string
	Hosts       string
}

// NamesFor returns the table names for a table prefix, e.g. "lakeshore-".
func NamesFor(prefix string) TableNames {
	return TableNames{
		Workers:     prefix + WorkersSuffix,
		Machines:    prefix + MachinesSuffix,
		Invocations: prefix + InvocationsSuffix,
		Commands:    prefix + CommandsSuffix,
		Queues:      prefix + QueuesSuffix,
		Idempotency: prefix + IdempotencySuffix,
		Connections: prefix + ConnectionsSuffix,
		Logs:        prefix + LogsSuffix,
		Hosts:       prefix + HostsSuffix,
	}
}
