// Package machineid finds the id nymph says hello with: the --machine-id
// flag, else the EC2 instance id (through agent/internal/imds), else a
// nymph-specific hash of /etc/machine-id, else the hostname. The agent's
// Run asks it once at boot; where the id came from also decides whether
// the spot watcher runs (agent/internal/spot).
package machineid

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
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Where a machine id came from, as Lookup reports it (logged at boot as
// machine_id_source).
const (
	SourceFlag     = "flag"
	SourceIMDS     = "imds"
	SourceFile     = "machine-id"
	SourceHostname = "hostname"
)

// Defaults of Options.
const (
	DefaultFile = "/etc/machine-id"
	// DefaultIMDSTimeout bounds the whole IMDS exchange (token and instance
	// id): off EC2 nothing answers, and start-up should not wait for it.
	DefaultIMDSTimeout = time.Second
)

// appKey makes the id derived from /etc/machine-id specific to nymph; see
// Lookup.
const appKey = "dreamlake/lakeshore/nymph machine id v1"

// Options configures Lookup. Zero fields take the defaults, which read the
// real host.
type Options struct {
	// IMDSEndpoint is the instance metadata service's base URL. Empty means
	// $AWS_EC2_METADATA_SERVICE_ENDPOINT, else imds.DefaultEndpoint.
	IMDSEndpoint string
	// IMDSTimeout bounds the IMDS lookup; zero means DefaultIMDSTimeout.
	IMDSTimeout time.Duration
	// File is read when IMDS does not answer; empty means DefaultFile.
	File string
	// Hostname is the last resort; nil means os.Hostname.
	Hostname func() (string, error)
	// Getenv reads AWS_EC2_METADATA_DISABLED and
	// AWS_EC2_METADATA_SERVICE_ENDPOINT; nil means os.Getenv.
	Getenv func(string) string
}

// Lookup reports the machine's id and which source gave it, trying in
// turn:
//
//   - flag, if non-empty (SourceFlag);
//   - the EC2 instance id from IMDSv2 (SourceIMDS), unless
//     AWS_EC2_METADATA_DISABLED=true — within about a second, so a host off
//     EC2 starts quickly;
//   - /etc/machine-id (SourceFile), hashed with a nymph-specific key as
//     machine-id(5) asks of anything sent off the host: the result is as
//     stable as the file but does not reveal it;
//   - the hostname (SourceHostname).
//
// Failures of one source fall through to the next; the error reports only
// that none gave an id.
func Lookup(ctx context.Context, flag string, opts Options) (id, source string, err error) {
	if id := strings.TrimSpace(flag); id != "" {
		return id, SourceFlag, nil
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
			return id, SourceIMDS, nil
		}
	}
	file := opts.File
	if file == "" {
		file = DefaultFile
	}
	if b, err := os.ReadFile(file); err == nil {
		if raw := strings.TrimSpace(string(b)); raw != "" {
			return appSpecific(raw), SourceFile, nil
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
	return name, SourceHostname, nil
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

// appSpecific derives nymph's id from the raw machine id the way
// sd_id128_get_machine_app_specific(3) does — an HMAC-SHA256 keyed by the
// machine id over an application key, cut to 128 bits.
func appSpecific(raw string) string {
	mac := hmac.New(sha256.New, []byte(raw))
	mac.Write([]byte(appKey))
	return hex.EncodeToString(mac.Sum(nil)[:16])
}
