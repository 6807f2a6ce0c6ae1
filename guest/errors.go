package guest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Kind says what a failed agent call tells about the agent, which decides
// what the caller checks on the host before it answers.
type Kind int

const (
	// Refused: the agent answered and refused the request (bad input, no
	// such file, no room); nothing to check.
	Refused Kind = iota
	// Failed: the agent answered with a failure of its own, which the same
	// call meets again; the sandbox may be ending under it.
	Failed
	// Unreachable: no answer came (the connection failed or broke, a
	// deadline passed); the sandbox may have ended or died.
	Unreachable
)

// String returns "refused", "failed" or "unreachable".
func (k Kind) String() string {
	switch k {
	case Refused:
		return "refused"
	case Failed:
		return "failed"
	}
	return "unreachable"
}

// Error is a classified failure of an agent call: Err carries the errdefs
// class (and the field, for bad input) and the agent's message, which names
// paths inside the sandbox only. Unwrap returns Err.
type Error struct {
	Kind Kind
	Err  error
	// Cause is the failure Err was made from when it is not the agent's
	// answer (a *DialError names the socket's host path): for logs, and
	// not in Err's chain, so that it reaches no client.
	Cause error
}

// Error returns Err's message.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the Kind of err's *Error, and false when err has none.
func KindOf(err error) (Kind, bool) {
	var ge *Error
	if !errors.As(err, &ge) {
		return 0, false
	}
	return ge.Kind, true
}

// ErrOutput marks an error returned by a node.Output callback while a
// stream was copied (Stream.Follow); the caller's own output failed, not
// the agent.
var ErrOutput = errors.New("output closed")

// AgentFailed returns the ErrInternal TypedError of node.ProblemAgentFailed
// with the agent's message (HTTP 502 at the edge).
func AgentFailed(msg string) error {
	return errdefs.Typed(errdefs.ErrInternal, node.ProblemAgentFailed, "the sandbox's agent failed: %s", msg)
}

// Classify maps err from a Client call made for a caller whose context is
// ctx to an errdefs class, as an *Error whose Kind tells the caller what
// to check. field names the request field an invalid_argument or
// not_found refers to ("" for none). Left as they are: nil, an *Error
// (already classified), ErrOutput, and a cancellation when ctx ended.
//
//   - invalid_argument, not_found: the field's FieldError, else
//     ErrInvalidArgument or ErrNotFound; unauthenticated: field "user";
//     already_exists, failed_precondition: ErrConflict;
//     permission_denied: ErrPermissionDenied; resource_exhausted (also an
//     answer over MaxMessage): ErrResourceExhausted. All Refused.
//   - internal, unknown, data_loss, unimplemented: node.ProblemAgentFailed
//     (Failed).
//   - canceled or deadline_exceeded when ctx ended: ctx's error.
//   - anything else, and every failure to talk to the agent (a broken
//     stream reads "protocol error: incomplete envelope"): ErrUnavailable
//     (Unreachable), retryable.
func Classify(ctx context.Context, err error, field string) error {
	if err == nil {
		return nil
	}
	var ge *Error
	if errors.As(err, &ge) || errors.Is(err, ErrOutput) || errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || !connect.IsWireError(ce) && ce.Code() != connect.CodeCanceled && ce.Code() != connect.CodeDeadlineExceeded &&
		ce.Code() != connect.CodeResourceExhausted { // (an answer larger than MaxMessage)
		msg := err.Error()
		if ce != nil {
			msg = ce.Message() // (without the code Connect puts first)
		}
		return &Error{Kind: Unreachable, Err: fmt.Errorf("agent: %s: %w", msg, errdefs.ErrUnavailable), Cause: err}
	}
	msg := ce.Message()
	refused := func(e error) error { return &Error{Kind: Refused, Err: e} }
	switch ce.Code() {
	case connect.CodeInvalidArgument:
		if field != "" {
			return refused(errdefs.InvalidField(field, "%s", msg))
		}
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrInvalidArgument))
	case connect.CodeNotFound:
		if field != "" {
			return refused(errdefs.InvalidField(field, "%s", msg))
		}
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrNotFound))
	case connect.CodeUnauthenticated:
		return refused(errdefs.InvalidField("user", "%s", msg))
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrConflict))
	case connect.CodePermissionDenied:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrPermissionDenied))
	case connect.CodeResourceExhausted:
		return refused(fmt.Errorf("%s: %w", msg, errdefs.ErrResourceExhausted))
	case connect.CodeInternal, connect.CodeUnknown, connect.CodeDataLoss, connect.CodeUnimplemented:
		return &Error{Kind: Failed, Err: AgentFailed(msg)}
	case connect.CodeCanceled, connect.CodeDeadlineExceeded:
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return &Error{Kind: Unreachable, Err: fmt.Errorf("agent: %s: %w", msg, errdefs.ErrUnavailable), Cause: err}
}

// StartField names the request field a failed Start refers to, from the
// agent's message: "cwd" or "env" when it is about those, else
// commandField (the caller's name for the command: "cmd" or "argv"); ""
// when err is not the agent's answer.
func StartField(err error, commandField string) string {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return ""
	}
	switch msg := ce.Message(); {
	case strings.HasPrefix(msg, "cwd"):
		return "cwd"
	case strings.HasPrefix(msg, "env"):
		return "env"
	}
	return commandField
}

// setUser names the user of an agent call the way envd expects it (Basic
// authorization with the name and an empty password).
func setUser(h interface{ Set(string, string) }, user string) {
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
}
