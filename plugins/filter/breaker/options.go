package breaker

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Options configure the filter. The package doc lists them with their
// defaults.
type Options struct {
	// Mode is "ratio" (a circuit breaker: closed, open, half-open) or "sre"
	// (adaptive throttling: reject locally with a probability that grows
	// as the backend accepts fewer requests).
	Mode string `json:"mode"`
	// Scope is what one breaker covers: "method-host" (one per method on
	// each instance), "host" (one per instance, whatever the method) or
	// "method" (one per method, whatever the instance).
	Scope string `json:"scope"`
	// Window is how the recent calls are counted: "time" (the calls of
	// the last WindowDuration, in WindowBuckets buckets) or "count" (the
	// last WindowSize calls).
	Window         string          `json:"window"`
	WindowDuration kernel.Duration `json:"window_duration"`
	WindowBuckets  int             `json:"window_buckets"`
	WindowSize     int             `json:"window_size"`
	// FailureRatio is the share of failed calls in the window at which a
	// closed breaker opens (mode ratio).
	FailureRatio float64 `json:"failure_ratio"`
	// MinRequests is how many calls the window must hold before the
	// breaker judges: below it, it neither opens (ratio) nor throttles
	// (sre).
	MinRequests int `json:"min_requests"`
	// OpenDuration is how long an open breaker refuses before it lets
	// probes through (mode ratio).
	OpenDuration kernel.Duration `json:"open_duration"`
	// HalfOpenProbes is how many calls a half-open breaker lets through at
	// once; as many successes close it, one failure opens it again (mode
	// ratio).
	HalfOpenProbes int `json:"half_open_probes"`
	// FailureCodes are the status codes that count as a failure of the
	// instance. Other codes are the caller's business (InvalidArgument,
	// NotFound...) and count as successes: the instance answered. Canceled
	// counts as neither.
	FailureCodes []kernel.Code `json:"failure_codes"`
	// K is the SRE multiplier (mode sre): requests are rejected locally
	// with probability max(0, (requests − K·accepts) / (requests + 1)).
	K float64 `json:"k"`
	// Share is where a breaker's open state lives: "none" (each client
	// judges by its own calls) or "registry" (an opening is published
	// through the client's registry, kernel.SharedStore, and every client
	// of the same share_namespace opens its breaker for that key too).
	// Mode ratio only.
	Share string `json:"share"`
	// ShareNamespace groups the clients that share breaker state (share:
	// registry): the keys are breaker/<share_namespace>/<method>|<host>.
	ShareNamespace string `json:"share_namespace"`
	// Logger receives the breakers' transitions; nil means slog.Default().
	// Code only: config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets.
func DefaultOptions() *Options {
	return &Options{
		Mode:           ModeRatio,
		Scope:          ScopeMethodHost,
		Window:         WindowTime,
		WindowDuration: kernel.Duration(10 * time.Second),
		WindowBuckets:  10,
		WindowSize:     100,
		FailureRatio:   0.5,
		MinRequests:    20,
		OpenDuration:   kernel.Duration(5 * time.Second),
		HalfOpenProbes: 3,
		FailureCodes:   []kernel.Code{kernel.Unavailable, kernel.DeadlineExceeded, kernel.Internal},
		K:              2,
		Share:          ShareNone,
		ShareNamespace: "default",
	}
}

// The values of Options.Mode, Options.Scope and Options.Window.
const (
	ModeRatio = "ratio"
	ModeSRE   = "sre"

	ScopeMethodHost = "method-host"
	ScopeHost       = "host"
	ScopeMethod     = "method"

	WindowTime  = "time"
	WindowCount = "count"

	ShareNone     = "none"
	ShareRegistry = "registry"
)

// maxBuckets bounds a time window's buckets: each costs a little on every
// call.
const maxBuckets = 120

// config is the validated options, as the circuits use them.
type config struct {
	sre          bool
	byMethod     bool
	byHost       bool
	count        bool          // a count window, else a time window
	size         int           // count window: calls kept
	buckets      int           // time window: buckets
	width        int64         // time window: one bucket's span, ns
	span         time.Duration // time window: its whole span
	ratio        float64
	min          int
	open         int64 // ns
	probes       int
	failureCodes uint64 // bit c set: code c is a failure
	codeNames    string // "Unavailable, DeadlineExceeded, Internal", for messages
	k            float64
	share        bool   // share: registry
	sharePrefix  string // "breaker/<share_namespace>/", escaped
}

// neverFailures are codes that must not count against an instance: a
// success, the caller's own bad request, the caller giving up.
var neverFailures = []kernel.Code{kernel.OK, kernel.InvalidArgument, kernel.Canceled}

func (o *Options) config() (*config, error) {
	c := &config{}
	switch o.Mode {
	case ModeRatio:
	case ModeSRE:
		c.sre = true
	default:
		return nil, fmt.Errorf("option \"mode\": must be %s or %s, got %q", ModeRatio, ModeSRE, o.Mode)
	}
	switch o.Scope {
	case ScopeMethodHost:
		c.byMethod, c.byHost = true, true
	case ScopeHost:
		c.byHost = true
	case ScopeMethod:
		c.byMethod = true
	default:
		return nil, fmt.Errorf("option \"scope\": must be %s, %s or %s, got %q", ScopeMethodHost, ScopeHost, ScopeMethod, o.Scope)
	}
	switch o.Window {
	case WindowCount:
		c.count = true
		if o.WindowSize < 1 {
			return nil, fmt.Errorf("option \"window_size\": must be at least 1 call, got %d", o.WindowSize)
		}
		if o.MinRequests > o.WindowSize {
			return nil, fmt.Errorf("option \"min_requests\": %d is more than the count window holds (window_size %d), so the breaker would never judge", o.MinRequests, o.WindowSize)
		}
		c.size = o.WindowSize
	case WindowTime:
		if o.WindowBuckets < 1 || o.WindowBuckets > maxBuckets {
			return nil, fmt.Errorf("option \"window_buckets\": must be between 1 and %d, got %d", maxBuckets, o.WindowBuckets)
		}
		if o.WindowDuration.D() < time.Duration(o.WindowBuckets)*time.Millisecond {
			return nil, fmt.Errorf("option \"window_duration\": must be at least 1ms per bucket (%d buckets), got %s", o.WindowBuckets, o.WindowDuration)
		}
		c.buckets, c.span = o.WindowBuckets, o.WindowDuration.D()
		c.width = int64(c.span) / int64(c.buckets)
	default:
		return nil, fmt.Errorf("option \"window\": must be %s or %s, got %q", WindowTime, WindowCount, o.Window)
	}
	if !(o.FailureRatio > 0 && o.FailureRatio <= 1) {
		return nil, fmt.Errorf("option \"failure_ratio\": must be above 0 and at most 1, got %v", o.FailureRatio)
	}
	if o.MinRequests < 1 {
		return nil, fmt.Errorf("option \"min_requests\": must be at least 1, got %d", o.MinRequests)
	}
	if o.OpenDuration <= 0 {
		return nil, fmt.Errorf("option \"open_duration\": must be positive, got %s", o.OpenDuration)
	}
	if o.HalfOpenProbes < 1 {
		return nil, fmt.Errorf("option \"half_open_probes\": must be at least 1, got %d", o.HalfOpenProbes)
	}
	if !(o.K >= 1) || math.IsInf(o.K, 1) {
		return nil, fmt.Errorf("option \"k\": must be a number of at least 1 (below 1 the throttle rejects a healthy backend's traffic), got %v", o.K)
	}
	if len(o.FailureCodes) == 0 {
		return nil, errors.New("option \"failure_codes\": must name at least one status code, or the breaker never opens")
	}
	names := make([]string, 0, len(o.FailureCodes))
	for _, code := range o.FailureCodes {
		if slices.Contains(neverFailures, code) {
			return nil, fmt.Errorf("option \"failure_codes\": %s is the caller's outcome, not the instance's failure, and must not count", code)
		}
		if code >= 64 {
			return nil, fmt.Errorf("option \"failure_codes\": %s is not a status code this filter knows", code)
		}
		if c.failureCodes&(1<<code) == 0 {
			names = append(names, code.String())
		}
		c.failureCodes |= 1 << code
	}
	c.codeNames = strings.Join(names, ", ")
	if err := c.shareConfig(o); err != nil {
		return nil, err
	}
	c.ratio, c.min, c.probes, c.k = o.FailureRatio, o.MinRequests, o.HalfOpenProbes, o.K
	c.open = int64(o.OpenDuration.D())
	return c, nil
}

func (c *config) shareConfig(o *Options) error {
	switch o.Share {
	case ShareNone:
	case ShareRegistry:
		if c.sre {
			return fmt.Errorf("option \"share\": %s shares the open state of a ratio breaker, and mode sre has none "+
				"(its rejection probability is each client's own reading of its calls): use share: %s with mode sre", ShareRegistry, ShareNone)
		}
		c.share = true
	default:
		return fmt.Errorf("option \"share\": must be %s or %s, got %q", ShareNone, ShareRegistry, o.Share)
	}
	if o.ShareNamespace == "" {
		return errors.New("option \"share_namespace\": is empty; leave it out for \"default\"")
	}
	c.sharePrefix = "breaker/" + url.PathEscape(o.ShareNamespace) + "/"
	return nil
}

// isFailure reports whether code counts against the instance.
func (c *config) isFailure(code kernel.Code) bool {
	return code < 64 && c.failureCodes&(1<<code) != 0
}

// windowName describes the window, for messages.
func (c *config) windowName() string {
	if c.count {
		return fmt.Sprintf("of the last %d calls", c.size)
	}
	return "in the last " + c.span.String()
}
