package provision

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Where a launched host's first user-data part puts its settings: what
// infra/user-data.sh reads (docs/provision.md).
const (
	provisionedEnvPath = "/etc/lakeshore/provisioned.env"
	hostSetupPath      = "/etc/lakeshore/host-setup.json"
	mimeBoundary       = "==LAKESHORE-PROVISIONED=="
)

// DefaultKeepAlive is how long a launched host's nymph waits idle before it
// leaves (bye idle) and the host powers off.
const DefaultKeepAlive = 10 * time.Minute

// templateUserData reads the user data of the launch template's default
// version (decoded; "" when it has none).
func (p *Provisioner) templateUserData(ctx context.Context) (string, error) {
	in := &ec2.DescribeLaunchTemplateVersionsInput{Versions: []string{"$Default"}}
	if lt := launchTemplate(p.cfg.LaunchTemplate); lt.LaunchTemplateId != nil {
		in.LaunchTemplateId = lt.LaunchTemplateId
	} else {
		in.LaunchTemplateName = lt.LaunchTemplateName
	}
	out, err := p.cfg.EC2.DescribeLaunchTemplateVersions(ctx, in)
	if err != nil {
		return "", err
	}
	if len(out.LaunchTemplateVersions) == 0 || out.LaunchTemplateVersions[0].LaunchTemplateData == nil {
		return "", nil
	}
	data := aws.ToString(out.LaunchTemplateVersions[0].LaunchTemplateData.UserData)
	if data == "" {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return "", fmt.Errorf("the launch template's user data is not base64: %w", err)
	}
	return string(b), nil
}

// userData is what host h boots with (base64, as RunInstances takes it): a
// MIME multipart whose first part writes the host's settings — the queue
// and capacity it serves, its exact host setup commands, a keep-alive and
// power-off when done — and whose second is the launch template's own user
// data (infra/fleet.yaml's runs infra/user-data.sh, which reads them).
func userData(base string, h domain.Host, capacity int, keepAlive time.Duration) (string, error) {
	env, setup, err := Settings(h, capacity, keepAlive)
	if err != nil {
		return "", err
	}

	var first strings.Builder
	first.WriteString("#!/bin/bash\n# Lakeshore provisioner: this host's settings (docs/provision.md).\nset -euo pipefail\n")
	fmt.Fprintf(&first, "install -d -m 0755 /etc/lakeshore\n")
	if setup != nil {
		// base64: the commands reach the file byte for byte, quotes and all.
		fmt.Fprintf(&first, "echo %s | base64 -d >%s\n", base64.StdEncoding.EncodeToString(setup), hostSetupPath)
	}
	fmt.Fprintf(&first, "echo %s | base64 -d >%s\n", base64.StdEncoding.EncodeToString([]byte(env)), provisionedEnvPath)

	var b strings.Builder
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n", mimeBoundary)
	part := func(contentType, body string) {
		fmt.Fprintf(&b, "--%s\nContent-Type: %s\nMIME-Version: 1.0\n\n%s\n", mimeBoundary, contentType, strings.TrimRight(body, "\n"))
	}
	part(`text/x-shellscript; charset="us-ascii"`, first.String())
	if strings.TrimSpace(base) != "" {
		if ct, rest, ok := mimeHead(base); ok {
			fmt.Fprintf(&b, "--%s\n%s\n%s\n", mimeBoundary, ct, strings.TrimRight(rest, "\n"))
		} else {
			part(`text/x-shellscript; charset="us-ascii"`, base)
		}
	}
	fmt.Fprintf(&b, "--%s--\n", mimeBoundary)
	return base64.StdEncoding.EncodeToString([]byte(b.String())), nil
}

// Settings are the two files a launched host's first user-data part writes:
// /etc/lakeshore/provisioned.env, which infra/user-data.sh sources (the
// queue and capacity h serves, its label, power-off when done, and nymph's
// keep-alive and host setup file, and no --adopt-host-setup when it has a
// host setup of its own), and /etc/lakeshore/host-setup.json, h's
// exact host setup commands (nil when it has none).
func Settings(h domain.Host, capacity int, keepAlive time.Duration) (env string, hostSetup []byte, err error) {
	var b strings.Builder
	fmt.Fprintf(&b, "QUEUE=%s\nCAPACITY=%d\nLABEL=%s\nSHUTDOWN_WHEN_DONE=yes\n", h.Key.Queue, capacity, h.ID)
	extra := []string{"NYMPH_KEEP_ALIVE=" + keepAlive.String()}
	if len(h.HostSetup) > 0 {
		if hostSetup, err = json.Marshal(h.HostSetup); err != nil {
			return "", nil, fmt.Errorf("encode the host setup of %s: %w", h.ID, err)
		}
		// A keyed host has its key: a template's --adopt-host-setup (for
		// the generic workers it also starts) must not refuse the setup.
		extra = append(extra, "NYMPH_HOST_SETUP_FILE="+hostSetupPath, "NYMPH_ADOPT_HOST_SETUP=false")
	}
	fmt.Fprintf(&b, "PROVISIONED_EXTRA_ENV='%s'\n", strings.Join(extra, "\n"))
	return b.String(), hostSetup, nil
}

// mimeHead splits user data that is already MIME (it starts with a
// Content-Type header) into its headers and the rest, so it nests as a
// part of its own.
func mimeHead(s string) (headers, rest string, ok bool) {
	if !strings.HasPrefix(strings.ToLower(s), "content-type:") {
		return "", "", false
	}
	i := strings.Index(s, "\n\n")
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}
