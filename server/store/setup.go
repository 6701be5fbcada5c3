package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/ids"
)

// AddSetup appends a command to worker id's setup FIFO. The worker claims
// nothing until the daemon has reported a result for it. The same
// transaction bumps the worker row's version, which ends a long poll waiting
// for that worker, and refuses a gone worker.
func (s *Store) AddSetup(ctx context.Context, id string, argv []string) (domain.SetupCommand, error) {
	w, err := s.GetWorker(ctx, id)
	if err != nil {
		return domain.SetupCommand{}, err
	}
	cmd, err := w.AddSetup(s.IDs.New(ids.Command), argv, s.now())
	if err != nil {
		return domain.SetupCommand{}, err
	}
	item, err := attributevalue.MarshalMap(toSetupCommandRecord(cmd))
	if err != nil {
		return domain.SetupCommand{}, fmt.Errorf("encode setup command: %w", err)
	}
	_, err = s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: versionedPut(s.tables.Commands, "command_id", item, 0)},
		// setup_added tells the worker's polls there is a FIFO to read
		// (domain.Worker.MayHaveSetup).
		{Update: &types.Update{
			TableName:        aws.String(s.tables.Workers),
			Key:              key("worker_id", id),
			UpdateExpression: aws.String("ADD version :one, setup_added :one"),
			// Not retired (domain.Retired) since it was read.
			ConditionExpression:      aws.String("attribute_exists(worker_id) AND #s <> :gone AND NOT (#h IN (:stopped, :terminated))"),
			ExpressionAttributeNames: map[string]string{"#s": "state", "#h": "host_status"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1), ":gone": str(domain.WorkerGone),
				":stopped": str(domain.HostStopped), ":terminated": str(domain.HostTerminated)},
		}},
	}})
	if failed, ok := cancelledBy(err); ok && slices.Contains(failed, 1) {
		// It went gone since it was read: refused as AddSetup refuses a
		// gone worker.
		gone, _ := w.Retire(domain.EndGone, "", cmd.CreatedAt)
		_, err := gone.AddSetup(cmd.CommandID, argv, cmd.CreatedAt)
		return domain.SetupCommand{}, err
	}
	if err != nil {
		return domain.SetupCommand{}, storeErr("add setup", err)
	}
	return cmd, nil
}

// SetupCommands lists worker id's setup commands in the order they were
// added; pendingOnly keeps those not yet reported.
func (s *Store) SetupCommands(ctx context.Context, id string, pendingOnly bool) ([]domain.SetupCommand, error) {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(s.tables.Commands),
		KeyConditionExpression:    aws.String("worker_id = :w"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":w": str(id)},
		ConsistentRead:            aws.Bool(true),
	}
	if pendingOnly {
		in.FilterExpression = aws.String("#s = :p")
		in.ExpressionAttributeNames = map[string]string{"#s": "status"}
		in.ExpressionAttributeValues[":p"] = str(domain.SetupPending)
	}
	var out []domain.SetupCommand
	err := s.queryEach(ctx, "setup commands of "+id, in, func(item map[string]types.AttributeValue) error {
		c, err := decodeSetupCommand(item)
		if err == nil {
			out = append(out, c)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RecordSetupResults stores the daemon's reports. Each moves a pending
// command of this worker to its result once; a repeat or an id that is not
// this worker's pending command changes nothing. A result without a command
// id is one of the daemon's own --host-setup commands: no command row to
// move, but it is recorded all the same (a failed host setup must show). The
// last result recorded becomes the worker row's last_setup_result, which is
// returned.
func (s *Store) RecordSetupResults(ctx context.Context, w domain.Worker, results []domain.SetupResult) (domain.Worker, error) {
	now := s.now()
	var last *domain.SetupResult
	for _, r := range results {
		if r.CommandID == "" {
			if r.Command != "" {
				last = &r
			}
			continue
		}
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(s.tables.Commands),
			Key: map[string]types.AttributeValue{
				"worker_id":  str(w.ID),
				"command_id": str(r.CommandID),
			},
			UpdateExpression:         aws.String("SET #s = :s, exit_code = :e, duration_ms = :d, output_tail = :o, finished_at = :f"),
			ConditionExpression:      aws.String("attribute_exists(command_id) AND #s = :p"),
			ExpressionAttributeNames: map[string]string{"#s": "status"},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":s": str(r.Status), ":e": num(int64(r.ExitCode)), ":d": num(r.DurationMS),
				":o": str(r.OutputTail), ":f": str(now.Format(time.RFC3339Nano)),
				":p": str(domain.SetupPending),
			},
		})
		switch {
		case isConditionFailed(err):
			continue
		case err != nil:
			return w, storeErr("record setup result "+r.CommandID, err)
		}
		last = &r
	}
	if last == nil {
		return w, nil
	}
	return s.updateWorker(ctx, "record setup result", w.ID, nil, always(func(w domain.Worker) (domain.Worker, error) {
		return w.RecordSetup(last), nil
	}))
}
