package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/blobs"
	lsconfig "github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/hoststatus"
	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/metrics/prom"
	"github.com/dreamlake/lakeshore/server/provision"
	"github.com/dreamlake/lakeshore/server/reaper"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/embedded"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/wake"
	"github.com/dreamlake/lakeshore/server/wake/wakelambda"
	"github.com/dreamlake/lakeshore/server/wake/wakesock"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/logjson"
)

type devOptions struct {
	addr          string
	storeKind     string
	tablePrefix   string
	enrollToken   string
	operatorToken string
	// previousEnroll and previousOperator are still accepted during a
	// rotation: the second of --enroll-token / --operator-token.
	previousEnroll   string
	previousOperator string
	enrollTokens     []string // the flags as given: current[,previous]
	operatorTokens   []string
	staleAfter       time.Duration
	hostPoll         time.Duration
	logLevel         string
	lambdas          string
	lambdaConc       int
	lambdaWarm       int
	longPoll         bool
	wakeChannel      bool
	claimShards      int
	provision        lsconfig.Provision
	// artifactsDir and artifactsBucket: where artifacts' bytes go
	// (devArtifacts); artifactsEnv tells the Lambda bootstraps.
	artifactsDir    string
	artifactsBucket string
	artifactsEnv    []string
}

// wakeChannel is where the dev server serves the wake channel: the socket
// URL hello hands out, the management endpoint that posts to sockets and
// the secret each management call must carry (all "" when
// --wake-channel=false).
type wakeChannel struct {
	url, endpoint, secret string
}

// wakePath is the wake channel's stage on the dev server: its sockets, and
// its management API under /wake/@connections/.
const wakePath = "/wake"

func newDevCmd() *cobra.Command {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole control plane locally: every route, on an embedded store or AWS",
		Long: `Run the whole control plane on one local port: every daemon and operator
route, over the embedded DynamoDB (default, in memory, gone on exit) or over
DynamoDB through the standard SDK configuration (--store aws; set
AWS_ENDPOINT_URL to use moto_server or LocalStack). Missing tables are created
from template.yaml. Tokens not given are generated and printed.

With --lambdas DIR it is what "sam local start-api" is: every route of
template.yaml's HttpApi is forwarded, as an API Gateway v2 event, to the real
bootstrap in DIR/<function>/bootstrap (make lambdas LAMBDA_ARCH=<this
machine's arch>) running under the Lambda runtime emulator (aws-lambda-rie,
make tools); the sweep, the host poll and the provisioner invoke their
bootstraps with scheduled events, and the functions reach each other
through a loopback Lambda Invoke API (what "sam local start-lambda" is: the
api function's provisioner nudge).

The wake channel is served at ws://ADDR/wake: daemons keep a socket there and
are told "poll now" when work they can take arrives, as API Gateway's
WebSocket API does on AWS (with --lambdas its routes run the real wake
bootstrap, and the Lambdas post through the emulated management API).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.addr, "addr", "127.0.0.1:3000", "listen address")
	f.StringVar(&o.storeKind, "store", "embedded", "state store: embedded (in memory) or aws (SDK config, AWS_ENDPOINT_URL)")
	f.StringVar(&o.tablePrefix, "table-prefix", "lakeshore-dev-", "DynamoDB table name prefix")
	f.StringSliceVar(&o.enrollTokens, "enroll-token", splitTokens(os.Getenv("LAKESHORE_ENROLL_TOKEN")),
		"enrollment token daemons send to hello (default: random); a second one (repeated, or current,previous) is still accepted during a rotation")
	f.StringSliceVar(&o.operatorTokens, "operator-token", splitTokens(os.Getenv("LAKESHORE_OPERATOR_TOKEN")),
		"operator token for the operator routes (default: random); a second one (repeated, or current,previous) is still accepted during a rotation")
	f.DurationVar(&o.staleAfter, "stale-after", domain.DefaultStaleAfter, "silence after which a worker reads stale")
	f.DurationVar(&o.hostPoll, "host-poll-interval", 5*time.Second, "with --store aws, how often to poll EC2 for the host status of workers on instances (0: never); the embedded store has no EC2, so it is ignored there")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.lambdas, "lambdas", "", "serve the routes through the real Lambda bootstraps in this directory (make lambdas) under aws-lambda-rie, as sam local start-api does; "+
		"each emulator runs one invocation at a time (about 1 ms of its own on top of the function's), a call that finds a function's emulators all busy waits for one to come free or to start "+
		"(one start at a time per function: the emulator's process, then the function's INIT, 20-60 ms, at its first call), so a burst queues for a moment where Lambda would scale out at once")
	f.IntVar(&o.lambdaConc, "lambda-concurrency", 32, "with --lambdas, the most emulators each function may run at once (started on demand, one invocation each); a long poll holds one, so keep it above the number of daemons")
	f.IntVar(&o.lambdaWarm, "lambda-warm", 1, "with --lambdas, the emulators each function starts ahead (at most --lambda-concurrency); each still runs the function's INIT at its first call")
	f.BoolVar(&o.longPoll, "long-poll", true, "in process, hold idle daemons' polls until work arrives (the Lambda routes never do: a held Lambda bills its wait)")
	f.BoolVar(&o.wakeChannel, "wake-channel", true, "serve the wake channel (a WebSocket that tells idle daemons to poll now); false: daemons only poll, as against an older control plane")
	f.IntVar(&o.claimShards, "claim-shards", 1, "split each queue's claim index partition in this many (LAKESHORE_CLAIM_SHARDS; for a queue busier than one DynamoDB partition takes; never lower it while work is queued)")
	f.StringVar(&o.provision.LaunchTemplate, "provision-launch-template", "", "launch hosts for queued work no live worker can take from this EC2 launch template (id lt-… or name; the SDK config, AWS_ENDPOINT_URL for moto); docs/provision.md")
	f.IntVar(&o.provision.MaxHosts, "provision-max-hosts", 0, "the most hosts the provisioner keeps launched at once (0: provisioning off)")
	f.IntVar(&o.provision.MaxHostsPerKey, "provision-max-hosts-per-key", 0, "the most launched hosts for one queue and host key (0: only --provision-max-hosts)")
	f.DurationVar(&o.provision.Interval, "provision-interval", lsconfig.DefaultProvisionInterval, "how often the provisioner looks at the queues")
	f.IntVar(&o.provision.HostCapacity, "provision-host-capacity", lsconfig.DefaultProvisionHostCapacity, "each launched host's nymph --capacity: how many invocations it runs at once, and so how many queued ones one launch covers")
	f.StringVar(&o.provision.Market, "provision-market", lsconfig.MarketSpotFirst, "how launched hosts are bought: "+strings.Join(lsconfig.ProvisionMarkets, ", ")+
		" (spot-first: on demand when EC2 refuses spot capacity; on-demand: the launch template's own market options, none by default)")
	f.StringVar(&o.artifactsDir, "artifacts-dir", "", "keep artifacts' bytes in this directory, behind URLs this server signs (default: a temporary directory removed on exit, unless --store aws, which uses --artifacts-bucket); docs/artifacts.md")
	f.StringVar(&o.artifactsBucket, "artifacts-bucket", "", "with --store aws and no --artifacts-dir, the S3 bucket artifacts go to, created if missing (default: "+devDefaultBucket+" on an emulator, AWS_ENDPOINT_URL; on AWS, a directory unless this is given)")
	return cmd
}

// splitTokens reads "current[,previous]" from the environment.
func splitTokens(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// pickTokens sets current and previous from a token flag's values: one is
// the token, a second the previous one (a rotation); more are refused.
func pickTokens(flag string, vals []string, current, previous *string) error {
	switch len(vals) {
	case 0:
	case 1, 2:
		*current = vals[0]
		if len(vals) == 2 {
			*previous = vals[1]
		}
	default:
		return fmt.Errorf("%s takes the current token and at most one previous one, got %d", flag, len(vals))
	}
	for _, v := range vals {
		if strings.TrimSpace(v) == "" {
			return fmt.Errorf("%s: an empty token", flag)
		}
	}
	return nil
}

func runDev(ctx context.Context, o devOptions) error {
	if path := os.Getenv(devProfileEnv); path != "" {
		stop, err := profileCPU(path)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := pickTokens("--enroll-token", o.enrollTokens, &o.enrollToken, &o.previousEnroll); err != nil {
		return err
	}
	if err := pickTokens("--operator-token", o.operatorTokens, &o.operatorToken, &o.previousOperator); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if o.staleAfter < time.Second {
		return fmt.Errorf("--stale-after must be at least 1s, got %s", o.staleAfter)
	}
	if o.claimShards < 1 || o.claimShards > lsconfig.MaxClaimShards {
		return fmt.Errorf("--claim-shards must be from 1 to %d, got %d", lsconfig.MaxClaimShards, o.claimShards)
	}
	if err := o.provision.Check(); err != nil {
		return fmt.Errorf("--provision-launch-template: %w", err)
	}
	if o.provision.MaxHosts > 0 && o.provision.Interval < time.Second {
		return fmt.Errorf("--provision-interval must be at least 1s, got %s", o.provision.Interval)
	}
	if o.lambdas != "" && o.lambdaConc < 1 {
		return fmt.Errorf("--lambda-concurrency must be at least 1, got %d", o.lambdaConc)
	}
	if o.lambdas != "" && (o.lambdaWarm < 0 || o.lambdaWarm > o.lambdaConc) {
		return fmt.Errorf("--lambda-warm must be from 0 to --lambda-concurrency (%d), got %d", o.lambdaConc, o.lambdaWarm)
	}
	log := logjson.New(os.Stderr, level)
	if !loopbackAddr(o.addr) {
		// Reachable from other machines: tokens are all that guards the
		// fleet there, and they travel without TLS.
		for _, t := range []struct{ flag, tok string }{{"--enroll-token", o.enrollToken}, {"--operator-token", o.operatorToken},
			{"--enroll-token", o.previousEnroll}, {"--operator-token", o.previousOperator}} {
			if t.tok != "" && len(t.tok) < minRoutableToken {
				return fmt.Errorf("%s is %d bytes; on a non-loopback --addr (%s) tokens must be at least %d (leave it out for a random one)",
					t.flag, len(t.tok), o.addr, minRoutableToken)
			}
		}
		log.Warn("serving on a non-loopback address: anyone who can reach it with a token drives the fleet, and requests are plain HTTP (no TLS)", "addr", o.addr)
	}

	db, endpoint, stopStore, err := openStore(ctx, o.storeKind, log)
	if err != nil {
		return err
	}
	defer stopStore()
	if err := schema.EnsureTables(ctx, db, o.tablePrefix); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}

	for _, tok := range []*string{&o.enrollToken, &o.operatorToken} {
		if *tok == "" {
			if *tok, err = auth.Random(24); err != nil {
				return fmt.Errorf("generate token: %w", err)
			}
		}
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.addr, err)
	}
	defer ln.Close()
	var wc wakeChannel
	if o.wakeChannel {
		secret, err := auth.Random(24)
		if err != nil {
			return fmt.Errorf("generate the wake management secret: %w", err)
		}
		wc = wakeChannel{url: "ws://" + ln.Addr().String() + wakePath, endpoint: "http://" + ln.Addr().String() + wakePath, secret: secret}
	}

	// /metrics (docs/metrics.md): the events of the use cases this process
	// runs, its requests to the store, and the gauges read from the store
	// at each scrape.
	var svc *control.Service
	var st *store.Store
	recorder := prom.New(func(ctx context.Context) (metrics.Gauges, error) {
		return svc.Gauges(ctx, st.WorkerRetention)
	}, log)
	st = store.New(dynamodb.New(db.Options(), store.OnRequest("metrics", recorder.StoreRequest)), o.tablePrefix)
	st.ClaimShards = o.claimShards
	// This process serves every poll of its fleet (with --lambdas, its
	// functions do, and open stores of their own).
	st.RememberWrites = true
	// One wake hub for the routes and the sweep: work either makes
	// claimable wakes a poll the routes hold.
	hub := &wake.Hub{}
	var wakeRoute wakesock.Route
	sockets := wakesock.New(wakePath, wc.secret, func(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
		return wakeRoute(ctx, ev)
	}, log)
	var poster control.Poster
	if o.wakeChannel {
		poster = sockets
	}
	// A submit nudges the provisioner (when it runs): a pass soon after, not
	// at its next interval.
	nudges := make(chan struct{}, 1)
	nudge := func(context.Context, domain.Invocation) {
		select {
		case nudges <- struct{}{}:
		default:
		}
	}
	arts, err := devArtifacts(ctx, &o, "http://"+ln.Addr().String(), log)
	if err != nil {
		return err
	}
	defer arts.close()
	// The process's one Service: the router's use cases, the sweep's and
	// the wake channel's, over one wake hub.
	svc = control.New(control.Config{Store: st, StaleAfter: o.staleAfter, Logger: log, Wake: hub, WakeURL: wc.url,
		Poster: poster, Metrics: recorder, LongPoll: o.longPoll, Submitted: nudge, WorkerRetention: st.WorkerRetention,
		Blobs: blobs.UseCases{Store: arts.store}})
	var handler http.Handler
	var sweepOnce, pollHostsOnce, provisionOnce func(context.Context) error
	if o.lambdas != "" {
		// The Lambda Invoke API the functions call (the api function's
		// provisioner nudge), on a port of its own on loopback.
		invokeLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("listen for the Lambda Invoke API: %w", err)
		}
		defer invokeLn.Close()
		gw, err := startLambdas(o, endpoint, "http://"+invokeLn.Addr().String(), wc, log)
		if err != nil {
			return err
		}
		defer gw.close()
		defer gw.logInits()
		invokeSrv := &http.Server{Handler: gw.invokeAPI(ctx), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = invokeSrv.Serve(invokeLn) }()
		defer invokeSrv.Close()
		handler = gw
		wakeRoute = gw.wakeRoute
		sweepOnce = func(ctx context.Context) error { return gw.invokeLogged(ctx, "reaper") }
		pollHostsOnce = func(ctx context.Context) error { return gw.invokeLogged(ctx, "hoststatus") }
		provisionOnce = func(ctx context.Context) error { return gw.invokeLogged(ctx, "provisioner") }
	} else {
		srv, err := api.New(api.Config{Sessions: st, Config: daemonapi.Config{
			Control:               svc,
			EnrollToken:           o.enrollToken,
			OperatorToken:         o.operatorToken,
			PreviousEnrollToken:   o.previousEnroll,
			PreviousOperatorToken: o.previousOperator,
			Logger:                log,
		}})
		if err != nil {
			return err
		}
		handler = srv
		wakeRoute = wakelambda.Handler(svc, auth.DaemonAuthToken, log)
		sweepOnce = func(ctx context.Context) error {
			reaper.Backfill(ctx, st, log)
			return sweep(ctx, svc, log)
		}
	}
	if o.wakeChannel {
		handler = withWakeChannel(handler, sockets)
	}
	if arts.dir != nil {
		handler = withBlobs(handler, arts.dir.Handler())
	}
	handler = withMetrics(handler, recorder.Handler())

	url := "http://" + ln.Addr().String()
	// These lines are the interface scripts and tests read: keep their shape.
	via := "in process"
	if o.lambdas != "" {
		via = "through the Lambda bootstraps in " + o.lambdas
	}
	fmt.Printf("lakeshore dev: listening on %s (store %s, tables %s*, routes %s)\n", url, o.storeKind, o.tablePrefix, via)
	fmt.Printf("LAKESHORE_URL=%s\n", url)
	fmt.Printf("LAKESHORE_ENROLL_TOKEN=%s\n", o.enrollToken)
	if wc.secret != "" {
		// What a call to the management API at /wake/@connections/ must
		// carry in X-Lakeshore-Wake-Secret.
		fmt.Printf("LAKESHORE_WAKE_SECRET=%s\n", wc.secret)
	}
	fmt.Printf("LAKESHORE_TOKEN=%s\n", o.operatorToken)

	// The reaper sweeps a quarter of the stale window apart, so a crashed
	// worker's work is handed out again within about stale_after × 1.25 of
	// its last poll.
	go every(ctx, max(o.staleAfter/4, 250*time.Millisecond), nil, "sweep", sweepOnce, log)
	if o.storeKind == "aws" && o.hostPoll > 0 {
		if pollHostsOnce == nil {
			cfg, err := config.LoadDefaultConfig(ctx, config.WithLogger(logjson.SDK(log)))
			if err != nil {
				return fmt.Errorf("load AWS config: %w", err)
			}
			p := &hoststatus.Poller{Store: st, Control: svc, EC2: ec2.NewFromConfig(cfg), Logger: log}
			pollHostsOnce = func(ctx context.Context) error { return pollHostsStore(ctx, p, log) }
		}
		// The hoststatus function's EC2 poll: the Lambda's schedule is a
		// minute; locally a few seconds, so a stopped or terminated
		// instance's worker reads gone and its work is handed back soon.
		go every(ctx, o.hostPoll, nil, "host poll", pollHostsOnce, log)
	}

	if o.provision.MaxHosts > 0 {
		// In process, a submit nudges the pass here; with --lambdas the
		// api function nudges the provisioner function (invokeAPI).
		if provisionOnce == nil {
			if provisionOnce, err = devProvisioner(ctx, o, st, recorder, log); err != nil {
				return err
			}
		}
		go every(ctx, o.provision.Interval, nudges, "provision", provisionOnce, log)
	}

	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	defer sockets.Close() // before the emulators stop: $disconnect runs on them
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// minRoutableToken is the shortest token `lakeshore dev` takes on an
// address other machines can reach.
const minRoutableToken = 16

// loopbackAddr reports whether listen address addr only takes local
// connections (127.0.0.0/8, ::1, localhost).
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// withBlobs serves the artifacts directory's signed URLs (blobs.Prefix)
// beside the routes.
func withBlobs(routes, dir http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, blobs.Prefix) {
			dir.ServeHTTP(w, r)
			return
		}
		routes.ServeHTTP(w, r)
	})
}

// devArtifactsStore is where `lakeshore dev` keeps artifacts' bytes.
type devArtifactsStore struct {
	store blobs.Store
	dir   *blobs.Dir // served at blobs.Prefix; nil for S3
	close func()
}

// devArtifacts opens the artifacts' store: with --store aws an S3 bucket
// (devBucket), else --artifacts-dir (by default a temporary directory
// removed on exit) behind URLs this server signs at base. It sets what
// the Lambda bootstraps are told of it (o.artifactsEnv).
func devArtifacts(ctx context.Context, o *devOptions, base string, log *slog.Logger) (devArtifactsStore, error) {
	if o.storeKind == "aws" && o.artifactsDir == "" {
		s3Store, err := devBucket(ctx, o, log)
		if err != nil {
			return devArtifactsStore{}, err
		}
		if s3Store != nil {
			return devArtifactsStore{store: s3Store, close: func() {}}, nil
		}
	}
	root, cleanup := o.artifactsDir, func() {}
	if root == "" {
		tmp, err := os.MkdirTemp("", "lakeshore-dev-artifacts-")
		if err != nil {
			return devArtifactsStore{}, fmt.Errorf("artifacts directory: %w", err)
		}
		root, cleanup = tmp, func() { _ = os.RemoveAll(tmp) }
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		cleanup()
		return devArtifactsStore{}, fmt.Errorf("artifacts secret: %w", err)
	}
	dir, err := blobs.NewDir(root, base, secret)
	if err != nil {
		cleanup()
		return devArtifactsStore{}, fmt.Errorf("artifacts directory %s: %w", root, err)
	}
	o.artifactsEnv = []string{lsconfig.EnvArtifactsDir + "=" + root, lsconfig.EnvArtifactsURL + "=" + base,
		lsconfig.EnvArtifactsSecret + "=" + hex.EncodeToString(secret)}
	return devArtifactsStore{store: dir, dir: dir, close: func() { _ = dir.Close(); cleanup() }}, nil
}

// devDefaultBucket is the bucket `lakeshore dev --store aws` uses on an
// emulator (AWS_ENDPOINT_URL) when --artifacts-bucket is not given.
const devDefaultBucket = "lakeshore-dev-artifacts"

// devBucket opens the S3 store of --store aws: --artifacts-bucket, or on
// an emulator (an endpoint is set) devDefaultBucket, created if missing.
// It reports nil (artifacts go to a directory) against real AWS without
// --artifacts-bucket (a bucket name is global: it is the operator's to
// choose), and, with a warning, when the emulator serves no S3.
func devBucket(ctx context.Context, o *devOptions, log *slog.Logger) (*blobs.S3, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithLogger(logjson.SDK(log)))
	if err != nil {
		return nil, fmt.Errorf("load AWS config: %w", err)
	}
	bucket, explicit := o.artifactsBucket, o.artifactsBucket != ""
	if !explicit {
		if cfg.BaseEndpoint == nil {
			return nil, nil
		}
		bucket = devDefaultBucket
	}
	s3c := s3.NewFromConfig(cfg, func(so *s3.Options) { so.UsePathStyle = cfg.BaseEndpoint != nil })
	_, err = s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	var owned *s3types.BucketAlreadyOwnedByYou
	switch {
	case err == nil || errors.As(err, &owned):
	case explicit:
		return nil, fmt.Errorf("create the artifacts bucket %s: %w", bucket, err)
	default:
		log.Warn("the endpoint serves no S3 bucket for artifacts; they go to a temporary directory (give --artifacts-bucket or --artifacts-dir)",
			"bucket", bucket, "error", err.Error())
		return nil, nil
	}
	o.artifactsEnv = []string{lsconfig.EnvArtifactsBucket + "=" + bucket}
	return blobs.NewS3FromConfig(cfg, bucket), nil
}

// withWakeChannel serves the wake channel's paths with sockets and
// everything else with routes (not through a ServeMux, which would redirect
// the paths the routes answer 404 themselves).
// withMetrics serves GET /metrics (Prometheus text, no token: a scraper's
// path, like /v1/healthz) in front of routes.
func withMetrics(routes, prom http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && r.Method == http.MethodGet {
			prom.ServeHTTP(w, r)
			return
		}
		routes.ServeHTTP(w, r)
	})
}

func withWakeChannel(routes, sockets http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wakePath || strings.HasPrefix(r.URL.Path, wakePath+"/") {
			sockets.ServeHTTP(w, r)
			return
		}
		routes.ServeHTTP(w, r)
	})
}

// openStore returns a DynamoDB client for the chosen store, the embedded
// store's endpoint ("" for aws) and a function that releases it.
func openStore(ctx context.Context, kind string, log *slog.Logger) (*dynamodb.Client, string, func(), error) {
	switch kind {
	case "embedded":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", nil, fmt.Errorf("embedded store: %w", err)
		}
		h := embedded.Handler()
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		endpoint := "http://" + ln.Addr().String()
		// Other processes (the --lambdas functions, an aws CLI) reach the
		// store at its endpoint; this process hands it its requests.
		direct := func(o *dynamodb.Options) { o.HTTPClient = embedded.Direct{Handler: h} }
		return store.EndpointClient(endpoint, direct), endpoint, func() { _ = hs.Close() }, nil
	case "aws":
		cfg, err := config.LoadDefaultConfig(ctx, config.WithLogger(logjson.SDK(log)))
		if err != nil {
			return nil, "", nil, fmt.Errorf("load AWS config: %w", err)
		}
		return dynamodb.NewFromConfig(cfg, store.SharedConnections(store.ServerPool)), "", func() {}, nil
	default:
		return nil, "", nil, fmt.Errorf("--store must be embedded or aws, got %q", kind)
	}
}

// sweep runs the reaper's sweep in process.
func sweep(ctx context.Context, svc *control.Service, log *slog.Logger) error {
	res, err := svc.Sweep(ctx)
	if res.Requeued > 0 {
		log.Info("sweep: handed back the work of lost workers", "lost_workers", res.Lost, "requeued", res.Requeued)
	}
	return err
}

// pollHostsStore runs the hoststatus function's EC2 poll in process.
func pollHostsStore(ctx context.Context, p *hoststatus.Poller, log *slog.Logger) error {
	res, err := p.Poll(ctx)
	if res.Changed > 0 {
		log.Info("host poll: host statuses changed", "workers", res.Workers, "changed", res.Changed)
	}
	return err
}

// every runs fn every interval until ctx ends, logging its errors; and
// soon after a nudge on nudges (nil: none; nudges within nudgeSettle of
// each other share one run).
func every(ctx context.Context, interval time.Duration, nudges <-chan struct{}, what string, fn func(context.Context) error, log *slog.Logger) {
	const nudgeSettle = 200 * time.Millisecond
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-nudges:
			if clock.Sleep(ctx, nudgeSettle) != nil {
				return
			}
		case <-t.C:
		}
		if err := fn(ctx); err != nil && ctx.Err() == nil {
			log.Error(what, "error", err.Error())
		}
	}
}

// devProvisioner is the provisioner's pass over st, launching through EC2
// as the standard SDK configuration says (AWS_ENDPOINT_URL: moto).
func devProvisioner(ctx context.Context, o devOptions, st *store.Store, m metrics.Provision, log *slog.Logger) (func(context.Context) error, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithLogger(logjson.SDK(log)))
	if err != nil {
		return nil, fmt.Errorf("provisioner: load AWS config: %w", err)
	}
	pc := provision.ConfigOf(o.provision)
	pc.Store, pc.EC2, pc.StaleAfter, pc.HostSetup, pc.Metrics, pc.Logger = st, ec2.NewFromConfig(cfg), o.staleAfter, st.HostSetupOf, m, log
	p := provision.New(pc)
	return func(ctx context.Context) error {
		res, err := p.Pass(ctx)
		if res.Launched+res.Failed+res.Ended > 0 {
			log.Info("provision pass", "launched", res.Launched, "refused", res.Failed, "let_go", res.Ended)
		}
		return err
	}, nil
}

// devProfileEnv, set to a path, has `lakeshore dev` write its CPU profile
// there until it stops (go tool pprof reads it): where the control
// plane's time goes under a fleet (docs/scale.md).
const devProfileEnv = "LAKESHORE_DEV_CPU_PROFILE"

// profileCPU starts a CPU profile into path and returns what ends it.
func profileCPU(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", devProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", devProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
