package agent

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/imds"

	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Where a machine id came from, as MachineID reports it.
const (
	MachineIDSourceFlag     = "flag"
	MachineIDSourceIMDS     = "imds"
	MachineIDSourceFile     = "machine-id"
	MachineIDSourceHostname = "hostname"
)

// Defaults of MachineIDOptions.
const (
	DefaultIMDSEndpoint  = imds.DefaultEndpoint
	DefaultMachineIDFile = "/etc/machine-id"
	// DefaultIMDSTimeout bounds the whole IMDS exchange (token and instance
	// id): off EC2 nothing answers, and start-up should not wait for it.
	DefaultIMDSTimeout = time.Second
)

// machineIDAppKey makes the id derived from /etc/machine-id specific to
// nymph; see MachineID.
const machineIDAppKey = "dreamlake/lakeshore/nymph machine id v1"

// MachineIDOptions configures MachineID. Zero fields take the defaults, which
// read the real host.
type MachineIDOptions struct {
	// IMDSEndpoint is the instance metadata service's base URL. Empty means
	// $AWS_EC2_METADATA_SERVICE_ENDPOINT, else DefaultIMDSEndpoint.
	IMDSEndpoint string
	// IMDSTimeout bounds the IMDS lookup; zero means DefaultIMDSTimeout.
	IMDSTimeout time.Duration
	// MachineIDFile is read when IMDS does not answer; empty means
	// DefaultMachineIDFile.
	MachineIDFile string
	// Hostname is the last resort; nil means os.Hostname.
	Hostname func() (string, error)
	// Getenv reads AWS_EC2_METADATA_DISABLED and
	// AWS_EC2_METADATA_SERVICE_ENDPOINT; nil means os.Getenv.
	Getenv func(string) string
}

// MachineID reports the machine's id and which source gave it, trying in
// turn:
//
//   - flag, if non-empty (MachineIDSourceFlag);
//   - the EC2 instance id from IMDSv2 (MachineIDSourceIMDS), unless
//     AWS_EC2_METADATA_DISABLED=true — within about a second, so a host off
//     EC2 starts quickly;
//   - /etc/machine-id (MachineIDSourceFile), hashed with a nymph-specific key
//     as machine-id(5) asks of anything sent off the host: the result is as
//     stable as the file but does not reveal it;
//   - the hostname (MachineIDSourceHostname).
//
// Failures of one source fall through to the next; the error reports only
// that none gave an id.
func MachineID(ctx context.Context, flag string, opts MachineIDOptions) (id, source string, err error) {
	if id := strings.TrimSpace(flag); id != "" {
		return id, MachineIDSourceFlag, nil
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if endpoint, src := imds.Resolve(opts.IMDSEndpoint, getenv); src != imds.None {
		timeout := opts.IMDSTimeout
		if timeout <= 0 {
			timeout = DefaultIMDSTimeout
		}
		if id, err := instanceID(ctx, endpoint, timeout); err == nil {
			return id, MachineIDSourceIMDS, nil
		}
	}
	file := opts.MachineIDFile
	if file == "" {
		file = DefaultMachineIDFile
	}
	if b, err := os.ReadFile(file); err == nil {
		if raw := strings.TrimSpace(string(b)); raw != "" {
			return appSpecificMachineID(raw), MachineIDSourceFile, nil
		}
	}
	hostname := opts.Hostname
	if hostname == nil {
		hostname = os.Hostname
	}
	name, err := hostname()
	if err != nil {
		return "", "", fmt.Errorf("no machine id: no IMDS, no usable %s, and the hostname: %w; pass --machine-id", file, err)
	}
	if name = strings.TrimSpace(name); name == "" {
		return "", "", fmt.Errorf("no machine id: no IMDS, no usable %s, and an empty hostname; pass --machine-id", file)
	}
	return name, MachineIDSourceHostname, nil
}

// instanceID asks IMDSv2 at endpoint for the instance id. It never falls
// back to IMDSv1 and does not retry: the whole exchange fits in timeout.
func instanceID(ctx context.Context, endpoint string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b, ok, err := imds.Get(ctx, imds.New(endpoint, imds.Options{}), "instance-id", wire.MaxIDLen+1)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(string(b))
	if !ok || id == "" || len(id) > wire.MaxIDLen || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", errors.New("imds: implausible instance id")
	}
	return id, nil
}

// appSpecificMachineID derives nymph's id from the raw machine id the way
// sd_id128_get_machine_app_specific(3) does — an HMAC-SHA256 keyed by the
// machine id over an application key, cut to 128 bits.
func appSpecificMachineID(raw string) string {
	mac := hmac.New(sha256.New, []byte(raw))
	mac.Write([]byte(machineIDAppKey))
	return hex.EncodeToString(mac.Sum(nil)[:16])
}

// bootIDs makes boot ids; ULIDs sort by start time, which helps whoever reads
// a worker's history.
var bootIDs ids.Generator

// BootID returns a fresh random id for this daemon process: a new one each
// start, so a hello with a new boot id proves the previous process dead and
// lets the control plane hand its work out again.
func BootID() string { return bootIDs.New("boot") }
