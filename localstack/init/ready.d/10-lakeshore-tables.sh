#!/usr/bin/env bash
# LocalStack READY hook: create Lakeshore's DynamoDB tables and, when the
# tokens are given, their SSM SecureString parameters.
#
# LocalStack runs every executable *.sh in /etc/localstack/init/ready.d once
# it serves requests (localstack/docker-compose.yml mounts this directory and
# the static lakeshore binary). It can also be run by hand against any
# endpoint, e.g. moto_server:
#
#   AWS_ENDPOINT_URL=http://127.0.0.1:5000 LAKESHORE_BIN=bin/lakeshore \
#     localstack/init/ready.d/10-lakeshore-tables.sh
#
# Environment (every one optional):
#   LAKESHORE_BIN               lakeshore binary (default /opt/lakeshore/lakeshore)
#   LAKESHORE_TABLE_PREFIX      table name prefix (default lakeshore-dev-)
#   LAKESHORE_ENROLL_TOKEN      if set, stored as SSM SecureString ...
#   LAKESHORE_ENROLL_TOKEN_PARAM    ... at this name (default /lakeshore/enroll-token)
#   LAKESHORE_OPERATOR_TOKEN    if set, stored as SSM SecureString ...
#   LAKESHORE_OPERATOR_TOKEN_PARAM  ... at this name (default /lakeshore/operator-token)
#   AWS_ENDPOINT_URL            default http://localhost:4566 (LocalStack, from inside its container)
#   AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
#                               default us-east-1, test, test
#
# Idempotent: existing tables are left alone and the parameters are
# overwritten with the same values, so running it again is harmless. Token
# values are never printed.
set -euo pipefail

log() { printf 'lakeshore init: %s\n' "$*" >&2; }

export AWS_ENDPOINT_URL="${AWS_ENDPOINT_URL:-http://localhost:4566}"
export AWS_REGION="${AWS_REGION:-${AWS_DEFAULT_REGION:-us-east-1}}"
export AWS_DEFAULT_REGION="$AWS_REGION"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
# Not on EC2: never wait for the instance metadata service.
export AWS_EC2_METADATA_DISABLED=true
# An empty profile name makes the AWS CLI look for a profile called "".
if [[ -z "${AWS_PROFILE:-}" ]]; then unset AWS_PROFILE; fi
export AWS_PAGER=""

bin="${LAKESHORE_BIN:-/opt/lakeshore/lakeshore}"
prefix="${LAKESHORE_TABLE_PREFIX:-lakeshore-dev-}"

if [[ ! -f "$bin" || ! -x "$bin" ]]; then
	log "no executable lakeshore binary at $bin: run 'make build' on the host before 'docker compose up' (the compose file mounts ../bin/lakeshore there), or set LAKESHORE_BIN"
	exit 1
fi
if ! "$bin" --help >/dev/null 2>&1; then
	log "cannot run $bin: it must be a Linux binary for this machine (on macOS: CGO_ENABLED=0 GOOS=linux go build -o bin/linux/lakeshore ./cli/lakeshore, then LAKESHORE_HOST_BIN=../bin/linux/lakeshore docker compose ... up)"
	exit 1
fi

log "tables with prefix $prefix at $AWS_ENDPOINT_URL"
"$bin" tables --table-prefix "$prefix"

# put_token NAME VALUE stores VALUE as the SecureString parameter NAME.
put_token() {
	local name="$1" value="$2"
	local -a cli
	if command -v awslocal >/dev/null 2>&1; then
		cli=(awslocal)
	elif command -v aws >/dev/null 2>&1; then
		cli=(aws --endpoint-url "$AWS_ENDPOINT_URL")
	else
		log "neither awslocal nor aws is installed: SSM parameter $name not stored"
		return 0
	fi
	"${cli[@]}" ssm put-parameter --name "$name" --type SecureString \
		--value "$value" --overwrite >/dev/null
	log "SSM parameter $name stored (SecureString)"
}

if [[ -n "${LAKESHORE_ENROLL_TOKEN:-}" ]]; then
	put_token "${LAKESHORE_ENROLL_TOKEN_PARAM:-/lakeshore/enroll-token}" "$LAKESHORE_ENROLL_TOKEN"
fi
if [[ -n "${LAKESHORE_OPERATOR_TOKEN:-}" ]]; then
	put_token "${LAKESHORE_OPERATOR_TOKEN_PARAM:-/lakeshore/operator-token}" "$LAKESHORE_OPERATOR_TOKEN"
fi
log "done"
