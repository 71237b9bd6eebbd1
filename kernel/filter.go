package kernel

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Side says which end of a call a filter runs on.
type Side uint8

const (
	ClientSide Side = 1
	ServerSide Side = 2
)

func (s Side) String() string {
	switch s {
	case ClientSide:
		return "client"
	case ServerSide:
		return "server"
	}
	return "Side(" + strconv.Itoa(int(s)) + ")"
}

// Stage says where in a client's pipeline a filter runs:
//
//	call filters → pick → attempt filters → transport → server filters → handler
//
// A call filter runs once per call, before any instance is picked: retry,
// hedge, timeout and tracing belong here, and each call of its next is a
// new attempt with a pick of its own. An attempt filter runs once per
// attempt, after the pick, with CallInfo.Instance set: a breaker per host
// or per-host metrics belong here.
type Stage uint8

const (
	CallStage    Stage = 1
	AttemptStage Stage = 2
)

func (s Stage) String() string {
	switch s {
	case CallStage:
		return "call"
	case AttemptStage:
		return "attempt"
	}
	return "Stage(" + strconv.Itoa(int(s)) + ")"
}

// StagedFilter is an optional Filter interface: a client filter that
// belongs in one stage says so, and a config that does not name a stage
// puts it there. Without it, a client filter runs in the call stage.
type StagedFilter interface {
	Stage() Stage
}

// SidedFilter is an optional Filter interface: a filter with work on one
// side only (a client's retries, hedges, breaker) says which, ClientSide
// or ServerSide. The engine leaves it out of the other side when its
// config entry names no side, and refuses an entry that names the other
// side, instead of running a filter that would pass every call through
// there. Without it, a filter runs on whichever sides its entry names.
type SidedFilter interface {
	Side() Side
}

// CallInfo describes one call (or, in the attempt stage, one attempt) to
// the filters it passes through. It is plain data: a filter may copy it
// and pass the copy on.
type CallInfo struct {
	Method string
	Side   Side
	// Peer is the remote address: on the server, from the start; on the
	// client, in the attempt stage, the picked instance's address (a call
	// filter finds the last attempt's there once next returns).
	Peer string
	// Codec is the name of the codec the call is encoded with.
	Codec string
	// Metadata travels with the request. A client filter may add to it
	// (see SetRequestMetadata) before calling next; on the server it is
	// what the client sent.
	Metadata Metadata
	// ResponseMetadata travels with the response: on the server a filter
	// or handler sets it; on the client, next fills it in from the answer
	// (nil when its last attempt got none: no instance, or the call's
	// context, or a deadline of the attempt's own, ended first; never an
	// earlier attempt's).
	ResponseMetadata Metadata
	// Instance is, on the client, the instance the balancer picked: set in
	// the attempt stage, and for a call filter once next returns.
	Instance *Instance
	// Attempt numbers the attempts of one client call from 1, in the
	// attempt stage; for a call filter once next returns, it is how many
	// attempts the call made (retries and hedges included); 0 before.
	Attempt int
	// RequestSize and ResponseSize are the encoded sizes of the messages
	// in bytes, once known: on the client both once next returns (of the
	// last attempt; ResponseSize only with an answer); on the server
	// RequestSize from the start. The server encodes the response after
	// its filters return, so their Invoke sees ResponseSize 0 and a
	// CallObserver's CallEnded sees it set.
	RequestSize, ResponseSize int
}

// SetRequestMetadata sets one request metadata entry, allocating the map on
// first use.
func (ci *CallInfo) SetRequestMetadata(k, v string) {
	if ci.Metadata == nil {
		ci.Metadata = make(Metadata, 2)
	}
	ci.Metadata[k] = v
}

// SetResponseMetadata sets one response metadata entry.
func (ci *CallInfo) SetResponseMetadata(k, v string) {
	if ci.ResponseMetadata == nil {
		ci.ResponseMetadata = make(Metadata, 2)
	}
	ci.ResponseMetadata[k] = v
}

// Invoker is what a filter calls to pass the call on: the next filter, or at
// the end of the chain the pick and the transport (client) or the handler
// (server).
type Invoker func(ctx context.Context, info *CallInfo, req any) (resp any, err error)

// Filter is middleware around a call, on the client or the server side.
//
// A filter may inspect the request, the metadata and the response, and
// may:
//   - answer by itself without calling next (a cache, a fallback, a
//     rejection: return a *Status). On the client the caller's reply then
//     receives the response the filter returned;
//   - call next once, and return or replace its response;
//   - on the client, call next several times, one after another (retry)
//     or at once (hedge). Each call of next in the call stage is an
//     independent attempt: its own pick, call id, cancellation (through
//     the ctx passed to it) and response value. Concurrent attempts must
//     each get a CallInfo of their own (a copy: ci := *info), since next
//     writes the attempt's outcome into the one it is given.
//
// The ctx passed to next must be the one Invoke received or derived from
// it. A filter must not keep info or req after Invoke returns: both are
// reused for later calls.
type Filter interface {
	Invoke(ctx context.Context, info *CallInfo, req any, next Invoker) (resp any, err error)
}

// FilterFunc adapts a function to Filter.
type FilterFunc func(ctx context.Context, info *CallInfo, req any, next Invoker) (any, error)

// Invoke calls f.
func (f FilterFunc) Invoke(ctx context.Context, info *CallInfo, req any, next Invoker) (any, error) {
	return f(ctx, info, req, next)
}

// Admitter is an optional Filter interface for server filters that decide
// from the call alone, without its request (authentication, overload
// protection, rate limits): the server calls Admit before it decodes the
// request, so a refused call costs no decoding. A nil error admits the
// call, which then passes through Invoke as usual; an error (a *Status)
// answers it. An admitted call may still fail before Invoke (its request
// does not decode, say), so Admit must not take anything that only Invoke
// gives back.
type Admitter interface {
	Admit(ctx context.Context, info *CallInfo) error
}

// CallObserver is an optional Filter interface for server filters that
// measure calls (metrics, consoles). The server calls CallEnded once for
// every call of a method it serves, after it encoded the answer, with
// info.ResponseSize set and err the error the call was answered with:
// for the calls that went through Invoke (handled is true; err is what the
// chain returned, or the Internal status sent instead of an answer that
// failed to encode, or the status sent instead of an answer the transport
// refused for its size, with ResponseSize 0), and for those answered
// before it, which no filter's Invoke sees: refused by an Admitter, or
// whose request did not decode (handled is false).
// It runs on the call's goroutine, so it must be quick and must not block.
type CallObserver interface {
	CallEnded(info *CallInfo, err error, handled bool)
}

// ContextValuer is an optional Filter interface for server filters that
// hand the handler a value derived from the call (the caller's trace
// context, read from its metadata) without a context allocated per call:
// a handler's context asks CallValue for every key that neither it nor a
// context derived from it holds, before the server's base context. The
// answer must depend on the call alone (the same key gives the same value
// all through the call), and the server may keep the first answers for
// the rest of the call; CallValue may be called from any goroutine the
// handler starts, concurrently, and must not block.
type ContextValuer interface {
	CallValue(info *CallInfo, key any) (value any, ok bool)
}

// Deadliner is an optional Filter interface for filters that give a call
// a deadline when its caller set none (the timeout filter). The engine
// asks CallTimeout as the call starts, before any filter runs, and keeps
// the deadline in the call's own context, which costs no allocation where
// a context.WithTimeout per call costs several; Invoke then finds the
// deadline set. The first Deadliner among the filters that apply to the
// method, in the order they run, that answers more than 0 gives the
// deadline; a client's client.timeout comes before them all. A
// Deadliner's Invoke must still give the deadline itself when its ctx has
// none, as when called outside the engine. CallTimeout must be quick and
// must not block.
type Deadliner interface {
	CallTimeout(info *CallInfo) time.Duration
}

// ErrInstanceRefused is what an attempt filter wraps in its error to refuse
// the picked instance (a breaker open for that host, say): nothing is sent
// and the client picks another instance, a bounded number of times, instead
// of failing the call.
var ErrInstanceRefused = errors.New("instance refused by an attempt filter")

// AttemptBudget is the token budget a client's filters spend extra
// attempts from (retries, hedges), so that together they cannot multiply
// an outage: a failed attempt costs a token, a successful call gives some
// back, and no extra attempt is paid for while the budget holds half its
// tokens or less. It is safe for concurrent use.
type AttemptBudget interface {
	// Failed charges a failed attempt and reports whether another attempt
	// may follow it (a retry).
	Failed() (retry bool)
	// Spend pays for an extra attempt no failure paid for (a hedge),
	// reporting false, and taking nothing, if the budget cannot.
	Spend() bool
	// CanSpend reports whether Spend would succeed now, without spending.
	CanSpend() bool
	// Succeeded gives back the refund for a successful call.
	Succeeded()
	// Tokens is what the budget holds now.
	Tokens() float64
}

// AttemptBudgetOwner is an optional Filter interface for client filters
// that keep an AttemptBudget. Such a filter that is also a PluginsObserver
// spends from the budget of the first AttemptBudgetOwner among its
// client's plugins, in config order (its own, if it is the first), so
// that a client's retry and hedge filters share one budget.
type AttemptBudgetOwner interface {
	AttemptBudget() AttemptBudget
}
