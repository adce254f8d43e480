package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
)

// callError is a call's failure as its caller sees it: a wire code and a
// message, and for RESOURCE_EXHAUSTED how long to wait. An internal
// failure also carries its cause, which only the server's log gets.
type callError struct {
	code     codes.Code
	msg      string
	pushback time.Duration
	// An internal failure's cause, logged as "<op> failed" with attrs.
	cause error
	op    string
	attrs []any
}

func (e *callError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *callError) Unwrap() error { return e.cause }

// storeRetry is the pushback of a call refused because the store could not
// be reached: long enough not to hammer a database that is coming back,
// short enough that service resumes soon after it does.
const storeRetry = 5 * time.Second

// refused is a refusal whose message the caller may read.
func refused(code codes.Code, format string, args ...any) *callError {
	return &callError{code: code, msg: fmt.Sprintf(format, args...)}
}

// unavailable is an internal failure of op: the caller is told msg and may
// retry; the server's log gets "<op> failed" with cause and attrs.
func unavailable(op, msg string, cause error, attrs ...any) *callError {
	return &callError{code: codes.Unavailable, msg: msg, cause: cause, op: op, attrs: attrs}
}

// storeFailure is a store error of op as the caller sees it: a missing or
// conflicting record names op, and anything else is an internal failure.
func storeFailure(op string, err error) *callError {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return refused(codes.NotFound, "%s: not found", op)
	case errors.Is(err, store.ErrConflict):
		return refused(codes.AlreadyExists, "%s: conflict", op)
	}
	return unavailable("store", op+": the store failed; retry, and see the server log", err, logkey.Op, op)
}

// signFailure is a failure of op to sign a certificate or an answer.
// When the key's device is unavailable (a PKCS#11 token that went away),
// the caller is told so and may retry later; the server's log gets
// "signing failed" with the token's error.
func signFailure(op string, err error, attrs ...any) *callError {
	if errors.Is(err, pki.ErrKeyUnavailable) {
		return unavailable("signing", op+": the control plane's signing key is unavailable (its PKCS#11 token does not answer); retry later", err, append(attrs, logkey.Op, op)...)
	}
	return unavailable(op, op+" failed; retry, and see the server log", err, attrs...)
}

// classify is the one place an error of a handler becomes what the caller
// is told. A join refusal is PERMISSION_DENIED "Join refused" whatever its
// reason (the handler logged and audited the reason); a callError is as it
// says, and its cause is logged here, once, with attrs; a gRPC status (a
// transport error of the stream, say) passes as it is; anything else is an
// internal failure, logged.
func (s *Server) classify(ctx context.Context, err error, attrs ...any) *callError {
	var (
		r  *refusal
		ce *callError
	)
	switch {
	case errors.As(err, &r):
		return &callError{code: codes.PermissionDenied, msg: JoinRefused}
	case errors.As(err, &ce):
	default:
		if st, ok := status.FromError(err); ok {
			return &callError{code: st.Code(), msg: st.Message()}
		}
		ce = unavailable("call", "the call failed; retry, and see the server log", err)
	}
	if ce.cause != nil {
		s.log.ErrorContext(ctx, ce.op+" failed", append(append(attrs, ce.attrs...), logkey.Error, ce.cause)...)
	}
	if ce.pushback == 0 && errors.Is(ce.cause, store.ErrUnavailable) {
		// The database is away: nothing was decided; the caller waits
		// and tries again (the node keeps its certificate and session).
		out := *ce
		out.pushback = storeRetry
		return &out
	}
	return ce
}

// wireError turns a handler's error into its gRPC status, with the
// grpc-retry-pushback-ms trailer when there is a pushback. Nil stays nil.
// The server's interceptors call it for every unary call and stream.
func (s *Server) wireError(ctx context.Context, err error, attrs ...any) error {
	if err == nil {
		return nil
	}
	ce := s.classify(ctx, err, attrs...)
	if ce.pushback > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(ceilMillis(ce.pushback), 10)))
	}
	return status.Error(ce.code, ce.msg)
}

// framedEnd is wireError for a framed session's SessionEnd: the
// grpc-retry-pushback-ms the gRPC Session would send, in whole
// milliseconds (0: none), and the gRPC status it would end with. Nil
// stays nil.
func (s *Server) framedEnd(ctx context.Context, err error, attrs ...any) (pushbackMs uint32, _ error) {
	if err == nil {
		return 0, nil
	}
	ce := s.classify(ctx, err, attrs...)
	return uint32(ceilMillis(ce.pushback)), status.Error(ce.code, ce.msg)
}

// sessionError turns the error of a request on a live session into the
// Error answer the session carries.
func (s *Server) sessionError(ctx context.Context, err error, attrs ...any) *gatewayv1.Error {
	ce := s.classify(ctx, err, attrs...)
	return &gatewayv1.Error{Code: uint32(ce.code), Message: ce.msg, RetryPushbackMs: uint32(ceilMillis(ce.pushback))}
}

// codeOf is the wire code err will be answered with, for metrics.
func codeOf(err error) codes.Code {
	var (
		r  *refusal
		ce *callError
	)
	switch {
	case err == nil:
		return codes.OK
	case errors.As(err, &r):
		return codes.PermissionDenied
	case errors.As(err, &ce):
		return ce.code
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return codes.Unavailable
}

// unaryErrors answers every unary call's error through wireError.
func (s *Server) unaryErrors(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil {
		return nil, s.wireError(ctx, err)
	}
	return resp, nil
}

// streamErrors answers every stream's error through wireError.
func (s *Server) streamErrors(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return s.wireError(ss.Context(), h(srv, ss))
}

// ceilMillis is d in whole milliseconds, rounded up: a node that waits
// exactly the pushback it was told must not come back early.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
