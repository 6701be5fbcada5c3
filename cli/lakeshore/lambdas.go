package main

import (
	"cmp"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/awslabs/goformation/v7"
	"github.com/awslabs/goformation/v7/cloudformation"
	"github.com/awslabs/goformation/v7/cloudformation/global"
	"github.com/awslabs/goformation/v7/cloudformation/serverless"

	"github.com/dreamlake/lakeshore"
	lsconfig "github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/server/rie"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/shared/clock"
)

// lambdaGateway is what `sam local start-api` is: the HttpApi of
// template.yaml served locally, each request forwarded as an API Gateway v2
// event to the route's real bootstrap running under the Lambda runtime
// emulator, and the function's answer written back as API Gateway would.
type lambdaGateway struct {
	routes []gatewayRoute
	pools  map[string]*rie.Pool // by function name: hello, poll, …, reaper
	log    *slog.Logger
	clock  clock.Clock
}

// gatewayRoute is one HttpApi event of template.yaml.
type gatewayRoute struct {
	method   string
	segments []string // "{id}" segments match any one segment
	fn       string
}

// lambdaConfig says where the bootstraps are and how to run them.
type lambdaConfig struct {
	dist     string   // directory holding <function>/bootstrap (make lambdas)
	env      []string // each function's environment
	logs     io.Writer
	emulator string
	maxConc  int // per function; 0: rie's default
	warm     int // emulators each function starts ahead
}

// functionName maps a template logical id to its functions/ directory and
// the Makefile's name: HostStatusFunction → hoststatus.
func functionName(logicalID string) string {
	return strings.ToLower(strings.TrimSuffix(logicalID, "Function"))
}

// newLambdaGateway reads the functions and routes from the embedded
// template.yaml and prepares a pool of emulators for every function.
func newLambdaGateway(cfg lambdaConfig, log *slog.Logger) (*lambdaGateway, error) {
	tmpl, err := goformation.ParseYAML(lakeshore.Template)
	if err != nil {
		return nil, fmt.Errorf("parse template.yaml: %w", err)
	}
	g := &lambdaGateway{pools: map[string]*rie.Pool{}, log: log}
	var missing []string
	fns := tmpl.GetAllServerlessFunctionResources()
	for id, fn := range fns {
		name := functionName(id)
		bootstrap := filepath.Join(cfg.dist, name, "bootstrap")
		if _, err := os.Stat(bootstrap); err != nil {
			missing = append(missing, bootstrap)
			continue
		}
		if err := checkArch(bootstrap); err != nil {
			g.close()
			return nil, err
		}
		pool, err := rie.NewPool(rie.Function{
			Name: name, Bootstrap: bootstrap, Emulator: cfg.emulator,
			Env: cfg.env, Timeout: functionTimeout(tmpl.Globals, fn), Logs: cfg.logs, MaxConcurrency: cfg.maxConc,
			Warm: cfg.warm,
		})
		if err != nil {
			g.close()
			return nil, err
		}
		g.pools[name] = pool
		for _, ev := range fn.Events {
			if ev.Type != "HttpApi" || ev.Properties == nil || ev.Properties.HttpApiEvent == nil {
				continue
			}
			e := ev.Properties.HttpApiEvent
			if e.Method == nil || e.Path == nil {
				continue
			}
			g.routes = append(g.routes, gatewayRoute{method: *e.Method, segments: strings.Split(strings.Trim(*e.Path, "/"), "/"), fn: name})
		}
	}
	if len(missing) > 0 {
		g.close()
		slices.Sort(missing)
		return nil, fmt.Errorf("--lambdas %s: missing %s; build them for this machine with `make lambdas LAMBDA_ARCH=%s`",
			cfg.dist, strings.Join(missing, ", "), runtime.GOARCH)
	}
	// API Gateway prefers the most specific route: literal segments beat
	// {param} segments.
	slices.SortStableFunc(g.routes, func(a, b gatewayRoute) int { return literals(b) - literals(a) })
	return g, nil
}

func literals(r gatewayRoute) int {
	n := 0
	for _, s := range r.segments {
		if !strings.HasPrefix(s, "{") {
			n++
		}
	}
	return n
}

// functionTimeout is the function's Timeout, else the Globals' one.
func functionTimeout(globals cloudformation.Globals, fn *serverless.Function) time.Duration {
	if fn.Timeout != nil {
		return time.Duration(*fn.Timeout) * time.Second
	}
	if f, ok := globals["Function"].(*global.Function); ok && f.Timeout != nil {
		return time.Duration(*f.Timeout) * time.Second
	}
	return 0
}

// checkArch refuses a bootstrap built for another machine: `make lambdas`
// builds for arm64 (the deploy target) unless told LAMBDA_ARCH.
func checkArch(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s is not a Linux executable: %w", path, err)
	}
	defer f.Close()
	arch := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64"}[f.Machine]
	if arch != runtime.GOARCH {
		return fmt.Errorf("%s is built for %s, this machine is %s: run `make lambdas LAMBDA_ARCH=%s`",
			path, cmp.Or(arch, f.Machine.String()), runtime.GOARCH, runtime.GOARCH)
	}
	return nil
}

// match returns the route for method and path, with its path parameters.
func (g *lambdaGateway) match(method, path string) (gatewayRoute, map[string]string, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for _, rt := range g.routes {
		n := len(rt.segments)
		// A greedy last segment ({proxy+}) takes one segment or more.
		greedy := n > 0 && strings.HasSuffix(rt.segments[n-1], "+}")
		if rt.method != method || (!greedy && n != len(segs)) || (greedy && len(segs) < n) {
			continue
		}
		params := map[string]string{}
		ok := true
		for i, s := range rt.segments {
			switch {
			case greedy && i == n-1:
				params[strings.Trim(s, "{}+")] = strings.Join(segs[i:], "/")
			case strings.HasPrefix(s, "{") && segs[i] != "":
				params[strings.Trim(s, "{}")] = segs[i]
			case s != segs[i]:
				ok = false
			}
			if !ok {
				break
			}
		}
		if ok {
			if len(params) == 0 {
				params = nil
			}
			return rt, params, true
		}
	}
	return gatewayRoute{}, nil, false
}

// ServeHTTP forwards r to its route's function, answering as API Gateway
// does when there is no route (404), the body is too large (413) or the
// function fails (500).
func (g *lambdaGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, params, ok := g.match(r.Method, r.URL.Path)
	if !ok {
		gatewayError(w, http.StatusNotFound, "Not Found")
		return
	}
	routeKey := rt.method + " /" + strings.Join(rt.segments, "/")
	ev, err := lambdahttp.Event(r, routeKey, params, g.clock.Now())
	if errors.Is(err, lambdahttp.ErrBodyTooLarge) {
		gatewayError(w, http.StatusRequestEntityTooLarge, "Request Entity Too Large")
		return
	}
	if err != nil {
		gatewayError(w, http.StatusBadRequest, "Bad Request")
		return
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		gatewayError(w, http.StatusInternalServerError, "Internal Server Error")
		return
	}
	out, err := g.pools[rt.fn].Invoke(r.Context(), payload)
	if err != nil {
		if r.Context().Err() == nil {
			g.log.Error("lambda invoke failed", "function", rt.fn, "route", routeKey, "error", err.Error())
		}
		gatewayError(w, http.StatusInternalServerError, "Internal Server Error")
		return
	}
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		g.log.Error("lambda answer is not an API Gateway response", "function", rt.fn, "error", err.Error())
		gatewayError(w, http.StatusInternalServerError, "Internal Server Error")
		return
	}
	if err := lambdahttp.WriteResponse(w, resp); err != nil {
		g.log.Error("lambda answer", "function", rt.fn, "error", err.Error())
		return
	}
	// The access log API Gateway would keep.
	g.log.Debug("request", "method", r.Method, "path", r.URL.Path, "function", rt.fn, "status", resp.StatusCode)
}

// gatewayError answers as API Gateway itself does, outside any function.
func gatewayError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"message": msg})
}

// invokeScheduled sends fn the event an EventBridge Scheduler schedule
// sends, and returns the function's answer.
func (g *lambdaGateway) invokeScheduled(ctx context.Context, fn string) ([]byte, error) {
	pool, ok := g.pools[fn]
	if !ok {
		return nil, fmt.Errorf("no function %q in template.yaml", fn)
	}
	ev, _ := json.Marshal(events.EventBridgeEvent{
		Version: "0", ID: "local", DetailType: "Scheduled Event", Source: "aws.scheduler",
		AccountID: "000000000000", Time: g.clock.Now().UTC(), Region: "local", Detail: json.RawMessage("{}"),
	})
	return pool.Invoke(ctx, ev)
}

// wakeRoute runs a route of the wake channel's WebSocket API on the wake
// bootstrap, as API Gateway's Lambda proxy integration does.
func (g *lambdaGateway) wakeRoute(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
	pool, ok := g.pools["wake"]
	if !ok {
		return events.APIGatewayProxyResponse{}, errors.New("no wake function in template.yaml")
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return events.APIGatewayProxyResponse{}, err
	}
	out, err := pool.Invoke(ctx, payload)
	if err != nil {
		return events.APIGatewayProxyResponse{}, fmt.Errorf("invoke wake for %s: %w", ev.RequestContext.RouteKey, err)
	}
	var resp events.APIGatewayProxyResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		return events.APIGatewayProxyResponse{}, fmt.Errorf("wake answered %s with no API Gateway response: %w", ev.RequestContext.RouteKey, err)
	}
	return resp, nil
}

// logInits reports each function's cold starts as the emulator measured them.
func (g *lambdaGateway) logInits() {
	for _, name := range slices.Sorted(maps.Keys(g.pools)) {
		s := g.pools[name].Stats()
		if s.Instances > 0 {
			g.log.Info("lambda function", "function", name, "instances", s.Instances, "invocations", s.Invocations, "init_ms", s.InitMS)
		}
	}
}

func (g *lambdaGateway) close() {
	for _, p := range g.pools {
		p.Close()
	}
}

// startLambdas prepares the gateway for `lakeshore dev --lambdas`: each
// function gets the environment the deployed one gets from template.yaml,
// pointed at this dev server's store. invokeURL is where the functions
// reach the Lambda Invoke API (invokeAPI).
func startLambdas(o devOptions, endpoint, invokeURL string, wake wakeChannel, log *slog.Logger) (*lambdaGateway, error) {
	emulator, err := rie.Find()
	if err != nil {
		return nil, fmt.Errorf("--lambdas: %w", err)
	}
	return newLambdaGateway(lambdaConfig{
		dist: o.lambdas, env: lambdaEnv(os.Environ(), o, endpoint, invokeURL, wake), logs: os.Stderr, emulator: emulator, maxConc: o.lambdaConc,
		warm: o.lambdaWarm,
	}, log)
}

// invokeAPI is what `sam local start-lambda` is: the Lambda Invoke API
// (POST /2015-03-31/functions/{name}/invocations), so a function that
// invokes another (the api function's provisioner nudge) runs that one's
// bootstrap. An Event invoke is answered 202 at once and runs on, under
// ctx, as Lambda queues it; any other runs and answers with the payload.
func (g *lambdaGateway) invokeAPI(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /2015-03-31/functions/{name}/invocations", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		pool, ok := g.pools[name]
		if !ok {
			w.Header().Set("X-Amzn-ErrorType", "ResourceNotFoundException")
			gatewayError(w, http.StatusNotFound, "Function not found: "+name)
			return
		}
		payload, err := io.ReadAll(io.LimitReader(r.Body, 6<<20))
		if err != nil {
			gatewayError(w, http.StatusBadRequest, err.Error())
			return
		}
		if r.Header.Get("X-Amz-Invocation-Type") == "Event" {
			w.WriteHeader(http.StatusAccepted)
			go func() {
				if _, err := pool.Invoke(ctx, payload); err != nil && ctx.Err() == nil {
					g.log.Error("async invoke failed", "function", name, "error", err.Error())
				}
			}()
			return
		}
		out, err := pool.Invoke(r.Context(), payload)
		if err != nil {
			gatewayError(w, http.StatusBadGateway, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	})
	return mux
}

// lambdaEnv is a function's environment: the caller's, without any
// LAKESHORE_ setting of its own, plus this server's configuration. On the
// embedded store (endpoint set) the SDK is pointed at it with local
// credentials, as storetest does for moto.
func lambdaEnv(environ []string, o devOptions, endpoint, invokeURL string, wake wakeChannel) []string {
	var env []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "LAKESHORE_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"LAKESHORE_TABLE_PREFIX="+o.tablePrefix,
		"LAKESHORE_ENROLL_TOKEN="+o.enrollToken,
		"LAKESHORE_OPERATOR_TOKEN="+o.operatorToken,
		"LAKESHORE_PREVIOUS_ENROLL_TOKEN="+o.previousEnroll,
		"LAKESHORE_PREVIOUS_OPERATOR_TOKEN="+o.previousOperator,
		"LAKESHORE_STALE_AFTER="+o.staleAfter.String(),
		"LAKESHORE_CLAIM_SHARDS="+strconv.Itoa(max(o.claimShards, 1)),
	)
	if wake.url != "" {
		env = append(env, lsconfig.EnvWakeURL+"="+wake.url, lsconfig.EnvWakeEndpoint+"="+wake.endpoint, lsconfig.EnvWakeSecret+"="+wake.secret)
	}
	env = append(env, o.artifactsEnv...) // where artifacts go (devArtifacts)
	if p := o.provision; p.MaxHosts > 0 {
		// The provisioner function's settings, as template.yaml gives
		// them, and the api function's nudge of it through invokeURL.
		env = append(env,
			lsconfig.EnvProvisionLaunchTemplate+"="+p.LaunchTemplate,
			lsconfig.EnvProvisionMaxHosts+"="+strconv.Itoa(p.MaxHosts),
			lsconfig.EnvProvisionMaxHostsPerKey+"="+strconv.Itoa(p.MaxHostsPerKey),
			lsconfig.EnvProvisionHostCapacity+"="+strconv.Itoa(p.HostCapacity),
			lsconfig.EnvProvisionMarket+"="+p.Market,
			lsconfig.EnvProvisionerFunction+"=provisioner",
			"AWS_ENDPOINT_URL_LAMBDA="+invokeURL)
	}
	if endpoint != "" {
		// EC2 stays where the caller's SDK configuration points it.
		for _, k := range []string{"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"} {
			if v := lookupEnv(environ, k); v != "" && o.provision.MaxHosts > 0 {
				env = append(env, "AWS_ENDPOINT_URL_EC2="+v)
				break
			}
		}
		// exec keeps the last of duplicate keys, so these win.
		env = append(env, "AWS_ENDPOINT_URL="+endpoint, "AWS_REGION="+store.EmbeddedRegion,
			"AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local", "AWS_SESSION_TOKEN=", "AWS_PROFILE=",
			"AWS_EC2_METADATA_DISABLED=true")
	}
	return env
}

// lookupEnv reports key's value in environ ("" if unset).
func lookupEnv(environ []string, key string) string {
	for _, kv := range slices.Backward(environ) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// invokeLogged runs a scheduled function (reaper, hoststatus) once and logs
// what it did when it did something.
func (g *lambdaGateway) invokeLogged(ctx context.Context, fn string) error {
	out, err := g.invokeScheduled(ctx, fn)
	if err != nil {
		return err
	}
	// The reaper answers store.SweepResult, hoststatus hoststatus.Result,
	// the provisioner provision.Result.
	var res struct{ Requeued, Changed, Launched, Failed, Ended, Asked int }
	if json.Unmarshal(out, &res) == nil && res.Requeued+res.Changed+res.Launched+res.Failed+res.Ended+res.Asked > 0 {
		g.log.Info(fn+" did work", "result", json.RawMessage(out))
	}
	return nil
}
