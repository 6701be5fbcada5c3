#!/usr/bin/env bash
# Lakeshore worker bootstrap: EC2 user data that installs nymph as a systemd
# service (docs/deploy.md). Idempotent: run again with the same settings it
# changes nothing and restarts nothing; with a new binary or new settings it
# replaces them and restarts nymph, which drains first.
#
# infra/fleet.yaml runs this file verbatim as its launch template's user
# data, after a few lines that set the settings below. After editing this
# file (or infra/nymph.service, copied below) run infra/sync.sh:
# tests/infra_test.go fails while the copies differ.
#
# Needs bash, coreutils, the AWS CLI (for the token in SSM and s3:// URLs;
# Amazon Linux 2023 ships it) and curl (IMDSv2, https:// URLs). The token is
# never in the user data (any process on the instance can read that from
# IMDS): it is read from SSM with the instance role at boot.
set -euo pipefail

# ---- settings: each may be set in the environment before this runs --------
# The static nymph binary (make build): s3://bucket/key, read with the
# instance role, or https://...
NYMPH_URL="${NYMPH_URL:-}"
# Its SHA-256 (sha256sum bin/nymph); nothing else is installed.
NYMPH_SHA256="${NYMPH_SHA256:-}"
# The control plane: the SAM stack's ApiUrl output.
CONTROL_PLANE_URL="${CONTROL_PLANE_URL:-}"
# The SSM SecureString that holds the enrollment token.
ENROLL_TOKEN_PARAMETER="${ENROLL_TOKEN_PARAMETER:-/lakeshore/enroll-token}"
QUEUE="${QUEUE:-default}"
CAPACITY="${CAPACITY:-1}"
LABEL="${LABEL:-}"
# More settings for nymph, one NYMPH_<FLAG>=value a line (NYMPH_KEEP_ALIVE=15m).
EXTRA_ENV="${EXTRA_ENV:-}"
# yes: power the instance off once nymph exits 0 by itself (an idle
# keep-alive, a drain command, a spot notice); with the launch template's
# shutdown behaviour "terminate", a drained worker's instance goes away.
SHUTDOWN_WHEN_DONE="${SHUTDOWN_WHEN_DONE:-no}"
# Region of the parameter and the bucket; empty: this instance's (IMDSv2).
AWS_REGION="${AWS_REGION:-}"
# Install under this directory instead of / (tests; systemctl is still run).
ROOT="${ROOT:-}"
# -----------------------------------------------------------------------------

# A host the provisioner launched (docs/provision.md) boots with a first
# user-data part that writes /etc/lakeshore/provisioned.env: the queue and
# capacity it was launched for, SHUTDOWN_WHEN_DONE=yes, and
# PROVISIONED_EXTRA_ENV lines (its host setup file, its keep-alive), which
# follow EXTRA_ENV's and so win.
PROVISIONED_EXTRA_ENV=""
if [[ -f "$ROOT/etc/lakeshore/provisioned.env" ]]; then
	# shellcheck source=/dev/null
	. "$ROOT/etc/lakeshore/provisioned.env"
	EXTRA_ENV="$EXTRA_ENV"$'\n'"$PROVISIONED_EXTRA_ENV"
fi

log() { printf 'lakeshore user-data: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ -n $ROOT || $EUID -eq 0 ]] || die "run as root"
[[ $NYMPH_URL == s3://* || $NYMPH_URL == https://* ]] || die "NYMPH_URL must be s3://bucket/key or https://..., got '$NYMPH_URL'"
[[ $NYMPH_SHA256 =~ ^[0-9a-f]{64}$ ]] || die "NYMPH_SHA256 must be 64 lower-case hex digits"
[[ $CONTROL_PLANE_URL =~ ^https?://[^[:space:]]+$ ]] || die "CONTROL_PLANE_URL must be an http(s) URL, got '$CONTROL_PLANE_URL'"
[[ $SHUTDOWN_WHEN_DONE == yes || $SHUTDOWN_WHEN_DONE == no ]] || die "SHUTDOWN_WHEN_DONE must be yes or no"
command -v aws >/dev/null || die "the AWS CLI is needed to read $ENROLL_TOKEN_PARAMETER from SSM (install AWS CLI v2)"

umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
changed=no      # anything nymph reads changed: restart it if it runs
unit_changed=no # a unit file changed: systemd must reload

# put SRC DEST MODE FLAG: installs SRC as DEST unless DEST already holds the
# same bytes, and then sets the variable named FLAG to yes.
put() {
	if [[ -f $2 ]] && cmp -s "$1" "$2"; then
		chmod "$3" "$2"
		return
	fi
	install -m "$3" "$1" "$2.new"
	mv -f "$2.new" "$2"
	printf -v "$4" yes
}

if [[ -z $AWS_REGION ]]; then
	imds=http://169.254.169.254/latest
	imds_token=$(curl -fsS --retry 5 --max-time 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "$imds/api/token")
	AWS_REGION=$(curl -fsS --retry 5 --max-time 5 -H "X-aws-ec2-metadata-token: $imds_token" "$imds/meta-data/placement/region")
fi
export AWS_REGION

# The token first: nothing is installed unless every input is in hand.
token=$(aws ssm get-parameter --name "$ENROLL_TOKEN_PARAMETER" --with-decryption \
	--query Parameter.Value --output text) ||
	die "could not read $ENROLL_TOKEN_PARAMETER from SSM (does the instance role allow ssm:GetParameter on it?)"
[[ -n $token && $token != None ]] || die "$ENROLL_TOKEN_PARAMETER is empty"

# The settings, rendered (and checked) before anything is installed. Values
# are single-quoted, which systemd's EnvironmentFile= reads literally.
env_line() {
	[[ $2 != *"'"* && $2 != *\\* && $2 != *$'\n'* ]] || die "$1: quotes, backslashes and newlines are not allowed"
	printf "%s='%s'\n" "$1" "$2" >>"$work/nymph.env"
}
printf '# Written by infra/user-data.sh; every nymph flag is also NYMPH_<FLAG>.\n' >"$work/nymph.env"
env_line NYMPH_CONTROL_PLANE "$CONTROL_PLANE_URL"
env_line NYMPH_ENROLL_TOKEN "$token"
env_line NYMPH_QUEUE "$QUEUE"
env_line NYMPH_CAPACITY "$CAPACITY"
[[ -z $LABEL ]] || env_line NYMPH_LABEL "$LABEL"
while IFS= read -r line; do
	[[ -n $line ]] || continue
	[[ $line =~ ^(NYMPH_[A-Z0-9_]+)=(.*)$ ]] || die "EXTRA_ENV: want NYMPH_<FLAG>=value lines, got '$line'"
	env_line "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
done <<<"$EXTRA_ENV"

install -d -m 0755 "$ROOT/usr/local/bin" "$ROOT/etc/systemd/system"
install -d -m 0700 "$ROOT/etc/nymph"

# The binary: fetched only when the installed one is not the wanted one.
bin="$ROOT/usr/local/bin/nymph"
if [[ ! -f $bin ]] || [[ $(sha256sum "$bin" | cut -d' ' -f1) != "$NYMPH_SHA256" ]]; then
	case $NYMPH_URL in
	s3://*) aws s3 cp --only-show-errors "$NYMPH_URL" "$work/nymph" ;;
	https://*) curl -fsSL --retry 5 --proto '=https' -o "$work/nymph" "$NYMPH_URL" ;;
	esac
	got=$(sha256sum "$work/nymph" | cut -d' ' -f1)
	[[ $got == "$NYMPH_SHA256" ]] || die "$NYMPH_URL has SHA-256 $got, want $NYMPH_SHA256"
	chmod 0755 "$work/nymph"
	"$work/nymph" --help >/dev/null 2>&1 || die "$NYMPH_URL does not run here (built for another architecture? GOARCH=arm64 make build)"
	put "$work/nymph" "$bin" 0755 changed
fi

put "$work/nymph.env" "$ROOT/etc/nymph/nymph.env" 0600 changed

# The unit: a copy of infra/nymph.service.
cat >"$work/nymph.service" <<'UNIT'
# nymph, the Lakeshore worker agent, as a systemd service (docs/deploy.md).
#
# Configuration lives in /etc/nymph/nymph.env (mode 0600, written by
# infra/user-data.sh): every flag is also NYMPH_<FLAG>, e.g.
# NYMPH_CONTROL_PLANE, NYMPH_ENROLL_TOKEN, NYMPH_QUEUE, NYMPH_CAPACITY,
# NYMPH_GRACE. Edit it, then `systemctl restart nymph` (which drains first).
#
# infra/user-data.sh carries a copy of this file; after editing it here run
# infra/sync.sh (tests/infra_test.go fails while the copies differ).

[Unit]
Description=Lakeshore worker agent (nymph)
Documentation=https://github.com/dreamlake/lakeshore/blob/main/docs/deploy.md
Wants=network-online.target
After=network-online.target
# Crash loops stop: a daemon that fails at once (exit 1 within a second or
# so) starts every RestartSec 30 s + ~1 s, so the sixth start falls ~155 s
# after the first, inside 240 s, and is refused; the unit reads "failed". A
# control plane that is down makes each start spend >= 32 s in hello's
# retries before it exits 1 (agent.HelloBackoffTotal), so a sixth start
# comes >= 310 s after the first: nymph keeps trying for as long as the
# outage lasts. A refused enrollment (a wrong or revoked token, exit 3) is
# not restarted at all: see RestartPreventExitStatus below.
StartLimitIntervalSec=240
StartLimitBurst=5

[Service]
# nymph sends READY=1 after its first hello is answered (the worker is
# registered), STOPPING=1 when a drain starts for any reason (SIGTERM, an
# idle --keep-alive, an operator's drain command, a spot notice) and a
# STATUS= line on every phase change (systemctl status nymph).
Type=notify
# Only nymph itself may notify: the work it runs shares the cgroup.
NotifyAccess=main
ExecStart=/usr/local/bin/nymph
# Defaults under StateDirectory; nymph.env may override them.
Environment=NYMPH_STATE_DIR=%S/nymph/state NYMPH_WORKDIR=%S/nymph/work
EnvironmentFile=/etc/nymph/nymph.env
# /var/lib/nymph: the ack spool (acks survive a restart) and the working
# directories of invocations. 0711: others may pass through (a --run-as
# user reaches its run directory) but not list; nymph keeps state/ at 0700.
StateDirectory=nymph
StateDirectoryMode=0711

# Stopping: SIGTERM to nymph alone. It drains: no new claims, in-flight work
# gets --grace (30 s), then SIGTERM to each body's process group,
# --kill-after (10 s), SIGKILL, and one bye. Whatever is left in the cgroup
# after nymph exits is killed by systemd.
KillMode=mixed
KillSignal=SIGTERM
# Above the worst drain with the default --grace and --kill-after: 30 s grace
# + 2 polls of 15 s + (10 + 5) s for killed bodies + (2 + 10) s ack flush
# + 2 s bye + 1 s = 90 s (agent.StopBudget). A longer --grace extends it at
# run time: nymph sends EXTEND_TIMEOUT_USEC with STOPPING=1.
TimeoutStopSec=120
# Above the longest start before READY=1 against a control plane that never
# answers: (10 + 2) s killing bodies a SIGKILLed nymph left + 15 s ack resend
# + 1 s IMDS + 8 hellos of 15 s + 39 s of backoff = 187 s (agent.StartBudget);
# then nymph gives up by itself (exit 1).
TimeoutStartSec=300

# nymph's exit codes (docs/agent.md):
#   0  a finished drain (a signal, an idle --keep-alive, a drain command, a
#      spot notice): stay down.
#   1  a failure a restart may cure: the control plane unreachable through
#      every hello retry, or a runtime failure. Restarted after RestartSec.
#   2  bad flags or settings in nymph.env: a restart cannot fix them.
#   3  hello refused (401/403): the enrollment token is wrong or revoked, and
#      the same token gets the same answer. Put the right one in nymph.env,
#      then `systemctl start nymph`.
#   4  not ready within --keep-alive: --host-setup failed and nothing
#      repaired the host, a setup command hung, or the workdir is not
#      writable: a restart would meet the same host.
#   5  machine id conflict: another host's nymph said hello with this
#      machine id and replaced this worker (a cloned /etc/machine-id?); a
#      restart would replace the other in turn. Give the host its own id.
# RestartPreventExitStatus keeps 2, 3, 4 and 5 down (the unit reads "failed").
Restart=on-failure
RestartSec=30
RestartPreventExitStatus=2 3 4 5

# A body killed by the kernel OOM killer is the body's failure, reported by
# nymph; without this, systemd would stop the whole service.
OOMPolicy=continue

# Hardening. nymph runs arbitrary operator work as root with the host's full
# view, so options that change what that work sees or may do are off:
# anything that makes a mount namespace (PrivateTmp, ProtectSystem,
# ProtectHome, ProtectKernel*, ProtectControlGroups, PrivateDevices,
# ReadOnlyPaths) would hide mounts made by --host-setup from the rest of the
# host (docker bind mounts of /tmp, for one); NoNewPrivileges breaks sudo and
# setuid tools; capability and syscall filters break package installs and
# containers. What stays on is what does not reach the work: secrets only in
# the 0600 env file (never in ExecStart, so not in ps), bodies started with a
# clean environment, notifications from nymph alone, the state directory
# 0700. If your work allows it, add a drop-in with e.g. PrivateTmp=yes,
# ProtectSystem=full, NoNewPrivileges=yes (docs/deploy.md).

[Install]
WantedBy=multi-user.target
UNIT
put "$work/nymph.service" "$ROOT/etc/systemd/system/nymph.service" 0644 unit_changed

dropin="$ROOT/etc/systemd/system/nymph.service.d/shutdown-when-done.conf"
if [[ $SHUTDOWN_WHEN_DONE == yes ]]; then
	install -d -m 0755 "${dropin%/*}"
	cat >"$work/dropin.conf" <<'DROPIN'
# Written by infra/user-data.sh (SHUTDOWN_WHEN_DONE=yes). Once nymph exits 0
# by itself (an idle keep-alive, a drain command, a spot notice), or exits 4
# (not ready within --keep-alive: a host setup nobody repaired, a hung setup
# command, an unwritable workdir: the instance is of no use), power it off. Not when systemd stopped or
# restarted it (a job for the unit is running then), and not after another
# failure (Restart= takes over).
# SuccessAction=poweroff would also fire on restarts before systemd 254.
[Service]
ExecStopPost=/bin/sh -c 'if { [ "$$SERVICE_RESULT" = success ] && [ "$$EXIT_STATUS" = 0 ]; } || [ "$$EXIT_STATUS" = 4 ]; then [ -z "$$(systemctl list-jobs --no-legend nymph.service)" ] && systemctl poweroff --no-block; fi; exit 0'
DROPIN
	put "$work/dropin.conf" "$dropin" 0644 unit_changed
elif [[ -f $dropin ]]; then
	rm -f "$dropin"
	unit_changed=yes
fi

if [[ $unit_changed == yes ]]; then
	systemctl daemon-reload
	changed=yes
fi
if [[ $changed == yes ]]; then
	# A running nymph picks up the new binary or settings (it drains first).
	systemctl try-restart --no-block nymph.service
fi
systemctl enable --now --no-block nymph.service
log "nymph is installed and starting: systemctl status nymph; journalctl -u nymph"
