package metrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-sidecar/sandbox-sidecar/ipc"
	"github.com/sandbox-sidecar/sandbox-sidecar/ipc/api"
)

// knownOps are the op label's values: the ops of the wire's one typed
// definition (ipc/api), so a new op is counted by its name from the start.
// A request for any other op is counted as "unknown", so a client cannot
// mint series.
var knownOps = func() map[string]bool {
	ops := make(map[string]bool, len(api.Requests))
	for op := range api.Requests {
		ops[op] = true
	}
	return ops
}()

// WrapHandler counts every request h answers: by op and code, its
// duration, and quota refusals by scope. What h optionally implements
// (ipc.Inliner, ipc.ConnObserver) is passed through.
// Nil metrics (metrics off) return h itself.
func (m *Metrics) WrapHandler(h ipc.Handler) ipc.Handler {
	if m == nil {
		return h
	}
	return &rpcHandler{m: m, h: h}
}

type rpcHandler struct {
	m *Metrics
	h ipc.Handler
}

func (r *rpcHandler) Handle(ctx context.Context, peer *ipc.Peer, req *ipc.Request) (any, error) {
	start := time.Now()
	result, err := r.h.Handle(ctx, peer, req)
	op := req.Op
	if !knownOps[op] {
		op = "unknown"
	}
	code := "ok"
	if err != nil {
		e := ipc.AsError(err)
		code = e.Code
		if !knownCode(code) {
			code = "other"
		}
		r.m.rpcErrors.WithLabelValues(op, code).Inc()
		var we *ipc.Error
		if code == ipc.CodeQuotaExceeded && errors.As(err, &we) {
			r.m.quotaRefusals.WithLabelValues(r.m.reason(fmt.Sprint(we.Details["scope"]))).Inc()
		}
	}
	r.m.rpcRequests.WithLabelValues(op, code).Inc()
	r.m.rpcSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return result, err
}

func (r *rpcHandler) Inline(op string) bool {
	in, ok := r.h.(ipc.Inliner)
	return ok && in.Inline(op)
}

func (r *rpcHandler) Disconnected(peer *ipc.Peer) {
	if o, ok := r.h.(ipc.ConnObserver); ok {
		o.Disconnected(peer)
	}
}

// knownCode bounds the code label: the daemon's codes are a short list of
// identifiers; anything else (it should not happen) is "other".
func knownCode(c string) bool {
	if c == "" || len(c) > 40 {
		return false
	}
	for _, r := range c {
		if (r < 'a' || r > 'z') && r != '_' {
			return false
		}
	}
	return true
}
