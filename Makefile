# Lakeshore build, test and check targets. Names are pinned (docs/design.md §8).
GO        ?= go
BIN       := bin
DIST      := dist
FUNCTIONS := hello poll ack bye api reaper hoststatus wake provisioner
# Lambda binaries: arm64 for deploy (template.yaml); LAMBDA_ARCH=amd64 for
# local runs under the runtime emulator on this machine.
LAMBDA_ARCH ?= arm64
STATIC    := CGO_ENABLED=0
LDFLAGS   := -s -w
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: all build demo lambdas test tools lint check bench bench-fleet clean localstack-test

# The Lambda Runtime Interface Emulator (what `sam local` runs in its
# container); tests run every bootstrap under it.
RIE_VERSION := v0.0.0-20261030222936-bef5c4ba774d

all: build

## build: static binaries bin/lakeshore and bin/nymph
build:
	$(STATIC) $(GO) build -trimpath -ldflags '$(LDFLAGS) -X main.version=$(VERSION)' -o $(BIN)/lakeshore ./cli/lakeshore
	$(STATIC) $(GO) build -trimpath -ldflags '$(LDFLAGS) -X main.version=$(VERSION)' -o $(BIN)/nymph ./agent/cmd/nymph

## demo: the main job on the embedded store (lakeshore dev, three nymphs, a killed worker)
demo: build
	bash scripts/demo.sh

## lambdas: one static bootstrap per function for provided.al2023
lambdas:
	@for f in $(FUNCTIONS); do \
		echo "lambda $$f ($(LAMBDA_ARCH))"; \
		$(STATIC) GOOS=linux GOARCH=$(LAMBDA_ARCH) $(GO) build -trimpath -tags lambda.norpc \
			-ldflags '$(LDFLAGS)' -o $(DIST)/$$f/bootstrap ./functions/$$f || exit 1; \
	done

## build-<LogicalId>: what `sam build` runs for each function (Metadata:
## BuildMethod: makefile); it sets ARTIFACTS_DIR.
SAM_FUNCTIONS := hello:HelloFunction poll:PollFunction ack:AckFunction bye:ByeFunction \
	api:ApiFunction reaper:ReaperFunction hoststatus:HostStatusFunction wake:WakeFunction \
	provisioner:ProvisionerFunction
define sam_build
.PHONY: build-$(2)
build-$(2):
	@test -n "$$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set (sam build sets it)"; exit 1; }
	$(STATIC) GOOS=linux GOARCH=$(LAMBDA_ARCH) $(GO) build -trimpath -tags lambda.norpc \
		-ldflags '$(LDFLAGS)' -o $$(ARTIFACTS_DIR)/bootstrap ./functions/$(1)
endef
$(foreach p,$(SAM_FUNCTIONS),$(eval $(call sam_build,$(word 1,$(subst :, ,$(p))),$(word 2,$(subst :, ,$(p))))))

## tools: install what the tests run besides moto_server (into GOPATH/bin)
tools:
	$(GO) install github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$(RIE_VERSION)

## test: every check and every test (starts moto_server and the emulator itself).
## The two longest packages are named first: go test starts packages in
## the order it is given them, so the shorter ones fill the other core
## while these run rather than delaying their start.
test: lint check tools
	@mkdir -p $(BIN)
	LAKESHORE_FAULT_REPORT=$(CURDIR)/$(BIN)/fault-report.txt $(GO) test -race -count=1 -timeout 12m ./tests/ ./server/store/ ./...
	@echo "fault suite (tests/faults_test.go; stale_after 3s, 3 agents):"; cat $(BIN)/fault-report.txt

## lint: gofmt, go vet, go mod tidy, cfn-lint
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	@if command -v cfn-lint >/dev/null 2>&1; then cfn-lint template.yaml template-iam.yaml && echo "cfn-lint: ok"; \
	elif [ "$${CI:-}" = "true" ]; then echo "cfn-lint is missing (pip install cfn-lint)"; exit 1; \
	else echo "cfn-lint not installed; skipping template check"; fi

## check: the layering of docs/design.md §1. shared/ (what the server and
## nymph both link) imports neither server/, agent/, functions/ nor cli/;
## nymph links no server/ package; the Lambdas that serve no routes do not
## link the router, and none links the Prometheus client; shared/domain
## imports nothing of this module but the hostkey leaf; the store and the
## use cases import no wire type; server/blobs links no other server/
## package; the per-invocation daemon functions (hello, poll, ack, bye) do
## not link the S3 client, the web view, the operator routes (server/api)
## nor a template engine; only the mains build a control.Service; no binary links a
## test-support package; in nymph only agent/internal/imds imports the
## SDK's IMDS client
check:
	@bad=$$($(GO) list -deps ./shared/... | grep -E 'lakeshore/(server|agent|functions|cli)(/|$$)' || true); \
		if [ -n "$$bad" ]; then echo "shared/ imports: $$bad (shared/ is what the server and nymph both link)"; exit 1; fi
	@bad=$$($(GO) list -deps ./agent/... | grep -E 'lakeshore/server/' || true); \
		if [ -n "$$bad" ]; then echo "nymph links a server package: $$bad (a rule both keep goes in a shared/ leaf such as shared/cadence)"; exit 1; fi
	@bad=$$($(GO) list -f '{{.ImportPath}} {{join .Imports " "}}' ./agent/... | grep -v '^github.com/dreamlake/lakeshore/agent/internal/imds ' | grep 'aws-sdk-go-v2/feature/ec2/imds' | cut -d' ' -f1 || true); \
		if [ -n "$$bad" ]; then echo "imports the SDK's IMDS client: $$bad (nymph reads IMDS only through agent/internal/imds: one client setup, one endpoint rule)"; exit 1; fi
	@for f in reaper hoststatus provisioner; do \
		bad=$$($(GO) list -deps ./functions/$$f | grep -E 'lakeshore/server/(api|lambdahttp)(/|$$)' || true); \
		if [ -n "$$bad" ]; then echo "functions/$$f links the router: $$bad"; exit 1; fi; \
	done
	@for f in hello poll ack bye; do \
		bad=$$($(GO) list -deps ./functions/$$f | grep -E 'aws-sdk-go-v2/service/s3$$|lakeshore/server/blobs(/|$$)' || true); \
		if [ -n "$$bad" ]; then echo "functions/$$f links the S3 client: $$bad (the artifact routes are the api function's; the daemon functions run per invocation and stay lean)"; exit 1; fi; \
	done
	@for f in hello poll ack bye; do \
		bad=$$($(GO) list -tags lambda.norpc -deps ./functions/$$f | grep -E 'lakeshore/(server/ui|server/api|shared/display|shared/client)$$|^html/template$$' || true); \
		if [ -n "$$bad" ]; then echo "functions/$$f links the web view or the whole router: $$bad (the daemon functions serve server/api/daemonapi alone; the web view's templates make the linker keep every exported method of every linked type, ~8 MB more to load at each cold start)"; exit 1; fi; \
	done
	@bad=$$($(GO) list -deps ./functions/... | grep -E 'prometheus|lakeshore/server/metrics/prom$$' || true); \
		if [ -n "$$bad" ]; then echo "a Lambda links the Prometheus client (they write EMF lines): $$bad"; exit 1; fi
	@bad=$$($(GO) list -deps ./shared/domain | grep 'dreamlake/lakeshore/' | grep -vE 'lakeshore/shared/(domain|hostkey)$$' || true); \
		if [ -n "$$bad" ]; then echo "shared/domain imports: $$bad (the rules import no adapter and no wire type)"; exit 1; fi
	@for p in store control; do \
		bad=$$($(GO) list -f '{{join .Imports "\n"}}' ./server/$$p | grep -E 'lakeshore/(shared/wire|server/api|server/lambdahttp)$$' || true); \
		if [ -n "$$bad" ]; then echo "server/$$p imports: $$bad (the core speaks domain; the HTTP edge maps it to the wire)"; exit 1; fi; \
	done
	@bad=$$($(GO) list -deps ./server/blobs | grep 'lakeshore/server/' | grep -v 'lakeshore/server/blobs$$' || true); \
		if [ -n "$$bad" ]; then echo "server/blobs links: $$bad (the blob stores are a leaf: the edge and the mains wire them)"; exit 1; fi
	@bad=$$(grep -rl 'control\.New(' --include='*.go' shared server agent | grep -v '_test\.go$$' | grep -vE '^server/(lambdamain|api/apitest|store/storetest)/' || true); \
		if [ -n "$$bad" ]; then echo "control.New outside a main: $$bad (one Service per process: its main builds it)"; exit 1; fi
	@bad=$$($(GO) list -deps ./cli/... ./agent/cmd/... ./functions/... | grep -E '^testing$$|lakeshore/.*test$$' || true); \
		if [ -n "$$bad" ]; then echo "a binary links test support (storetest, waittest, ...): $$bad"; exit 1; fi
	@echo "layering: ok"

## bench: store benchmarks (claims/s, conflicts/claim, requests/lifecycle, a 10,000-job run), each
## Lambda's cold start under the emulator and size, the submit call at 50/s through the
## bootstraps (dev --lambdas) and in process, how soon a body hears a drain,
## a 256 MiB artifact's publish (MB/s, nymph's RSS while it uploads) and the daemon's footprint
bench: build tools lambdas
	$(GO) test -run '^$$' -bench 'Claim|Lifecycle' -benchtime 200x ./server/store/
	$(GO) test -run '^$$' -bench 'BenchmarkRun' -benchtime 1x ./server/store/
	$(GO) test -run '^$$' -bench LambdaColdStart -benchtime 5x ./tests/
	$(GO) test -run '^$$' -bench Dispatch -benchtime 1x -timeout 30m ./tests/
	$(GO) test -run '^$$' -bench LambdaSubmitRate -benchtime 1x -timeout 20m ./tests/
	$(GO) test -run '^$$' -bench DrainNotice -benchtime 3x ./tests/
	$(GO) test -run '^$$' -bench WarmStart -benchtime 1x ./tests/
	$(GO) test -run '^$$' -bench Publish -benchtime 1x ./tests/
	@echo "deploy bootstraps ($(LAMBDA_ARCH), dist/; target <= 15 MB, kept for hello, poll, ack and bye):"
	@for f in $(FUNCTIONS); do stat -c '  %n %s bytes' $(DIST)/$$f/bootstrap; done
	@for f in hello poll ack bye; do \
		n=$$(stat -c %s $(DIST)/$$f/bootstrap); \
		if [ "$$n" -gt 15000000 ]; then echo "$(DIST)/$$f/bootstrap is $$n bytes, over 15 MB (a daemon function cold-starts on every daemon's path: go tool nm -size -sort size shows what it links)"; exit 1; fi; \
	done
	bash scripts/footprint.sh

## bench-fleet: the fleet simulator (docs/scale.md): 1,000 virtual workers idle
## for 5 minutes, then 200 submits/s for 2 minutes with 5 % of the workers
## killed, in process (`lakeshore dev` with its embedded store, as it runs
## by default); then the same fleet through --lambdas. Each scenario
## runs even if one before it failed; LAKESHORE_FLEET_* change their sizes.
FLEET_SCENARIOS ?= idle churn lambdas
bench-fleet: tools
	@rc=0; for s in $(FLEET_SCENARIOS); do \
		echo "fleet scenario $$s"; \
		$(GO) test -count=1 -run '^$$' -bench "^BenchmarkFleet$$/^$$s\$$" -benchtime 1x -timeout 30m ./tests/ || rc=1; \
	done; exit $$rc

## localstack-test: the integration suite against a running LocalStack (docs/localstack.md)
LOCALSTACK_URL ?= http://127.0.0.1:4566
localstack-test:
	@health=$$(curl -fsS --max-time 5 $(LOCALSTACK_URL)/_localstack/health 2>/dev/null) || { \
		echo "LocalStack does not answer at $(LOCALSTACK_URL)/_localstack/health. Start it with:"; \
		echo "  make build"; \
		echo "  LOCALSTACK_AUTH_TOKEN=<your token> docker compose -f localstack/docker-compose.yml up -d --wait"; \
		exit 1; }; \
	if ! printf '%s' "$$health" | grep -Eq '"dynamodb": *"(available|running)"'; then \
		echo "LocalStack at $(LOCALSTACK_URL) does not serve DynamoDB (start it with localstack/docker-compose.yml): $$health"; \
		exit 1; \
	fi
	LAKESHORE_TEST_AWS_ENDPOINT=$(LOCALSTACK_URL) AWS_ENDPOINT_URL=$(LOCALSTACK_URL) \
		$(GO) test -count=1 -timeout 15m ./tests/ ./server/store/...

## fuzz: every native fuzz target for FUZZTIME each (default 5m), one after
## another; a failing input is saved under the package's testdata/fuzz/.
## FUZZMINIMIZE bounds the minimizing of each new input (go's default, 60s,
## stalls the router targets, whose valid inputs reset the store).
FUZZTIME     ?= 5m
FUZZPARALLEL ?= 2
FUZZMINIMIZE ?= 5s
FUZZ_TARGETS := shared/wire:FuzzDecode server/api:FuzzHello server/api:FuzzPoll server/api:FuzzAck \
	server/api:FuzzBye server/api:FuzzLogs server/api:FuzzOperatorPost server/api:FuzzOperatorGet \
	server/api:FuzzArtifacts server/api:FuzzArtifactComplete \
	server/ui:FuzzUIForms server/ui:FuzzANSI agent/internal/lifecycle:FuzzLifecycleView \
	server/store/embedded:FuzzQuery server/store/embedded:FuzzParseKeyCondition
.PHONY: fuzz
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name (./$$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) \
			-fuzzminimizetime $(FUZZMINIMIZE) -parallel $(FUZZPARALLEL) ./$$pkg || exit 1; \
	done

## template-iam.yaml: the IAM-mode template, generated from template.yaml
## (daemon routes behind API Gateway's AWS_IAM authorizer; docs/security.md)
.PHONY: template-iam.yaml
template-iam.yaml:
	$(GO) run ./cli/lakeshore template --daemon-auth iam > $@.tmp && mv $@.tmp $@

clean:
	rm -rf $(BIN) $(DIST)
