package daemonapi

import (
	"net/http"
	"strings"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// daemonToken reads a daemon route's token where the mode puts it.
func (s *Router) daemonToken(r *http.Request) string {
	if s.cfg.DaemonAuth == auth.DaemonAuthIAM {
		return strings.TrimSpace(r.Header.Get(wire.TokenHeader))
	}
	return auth.Bearer(r)
}

// callerInstance reports, in IAM mode, the EC2 instance API Gateway's
// AWS_IAM authorizer verified as the caller ("" in token mode).
func (s *Router) callerInstance(r *http.Request) (string, error) {
	if s.cfg.DaemonAuth != auth.DaemonAuthIAM {
		return "", nil
	}
	ev, ok := lambdahttp.EventFromContext(r.Context())
	if !ok || ev.RequestContext.Authorizer == nil || ev.RequestContext.Authorizer.IAM == nil {
		return "", wire.Errorf(wire.CodeUnauthorized, "IAM mode: the request carries no AWS_IAM caller identity (daemon routes must come through API Gateway's AWS_IAM authorizer, signed with SigV4)")
	}
	arn := ev.RequestContext.Authorizer.IAM.UserARN
	instance, ok := auth.CallerInstance(arn)
	if !ok {
		return "", wire.Errorf(wire.CodeForbidden, "IAM mode: the caller %q is not an EC2 instance role session", arn)
	}
	return instance, nil
}

// sameInstance refuses, in IAM mode, a machine id other than the caller's.
func sameInstance(instance, machineID string) error {
	if !auth.SameInstance(instance, machineID) {
		return wire.Errorf(wire.CodeForbidden, "IAM mode: machine_id %q is not the calling instance %s", machineID, instance)
	}
	return nil
}
