package faulty

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the transport's config name.
const Name = "faulty"

// Factory builds faulty transports from config; init registers it.
var Factory = kernel.NewFactory[kernel.Transport](Name,
	"wraps another transport by name and injects faults (delay, drop, duplicate, corrupt, truncate, reset, stall, blackhole), deterministically by seed",
	DefaultOptions, New)

func init() { kernel.RegisterTransport(Factory) }

// Options configure a faulty transport; the package doc lists the
// defaults. Every probability is per frame, from 0 (never) to 1 (always).
type Options struct {
	// Transport is the transport wrapped, built by name through the
	// kernel's plugin table.
	Transport Inner `json:"transport"`
	// Seed makes the faults reproducible: each connection draws from a
	// generator seeded with it, its side and its number on that side.
	Seed uint64 `json:"seed"`
	// Side is whose connections misbehave: dial, listen or both.
	Side string `json:"side"`
	// Frames are the frame types the faults touch.
	Frames []string `json:"frames"`
	// Delay holds every affected frame back this long, plus up to
	// DelayJitter at random; frames keep their order.
	Delay       kernel.Duration `json:"delay"`
	DelayJitter kernel.Duration `json:"delay_jitter"`
	// Drop, Duplicate, Corrupt and Truncate are the probabilities that an
	// affected frame is lost, sent twice, sent with one byte flipped, or
	// sent with its payload cut short.
	Drop      float64 `json:"drop"`
	Duplicate float64 `json:"duplicate"`
	Corrupt   float64 `json:"corrupt"`
	// CorruptIn is where Corrupt flips a byte: "payload" (the receiver
	// gets an intact header and a damaged payload) or "frame" (anywhere in
	// the frame as encoded, header and length prefix included; the
	// receiver gets what it would decode from those bytes, or closes the
	// connection when they do not decode).
	CorruptIn string  `json:"corrupt_in"`
	Truncate  float64 `json:"truncate"`
	// Reset is the probability that an affected frame resets the
	// connection instead of being sent; ResetAfter resets it instead of
	// sending the affected frame after that many (0: never).
	Reset      float64 `json:"reset"`
	ResetAfter int     `json:"reset_after"`
	// StallAfter stops the connection's writing after that many affected
	// frames (0: never): later frames are accepted and never leave, as if
	// the peer had stopped reading.
	StallAfter int `json:"stall_after"`
	// Blackhole makes the side's connections take every frame and never
	// send or deliver one.
	Blackhole bool `json:"blackhole"`
	// Logger receives a line for every reset and undecodable corruption
	// injected, at debug level; nil means slog.Default(). Code only.
	Logger *slog.Logger `json:"-"`
}

// Inner names the wrapped transport and gives it its options.
type Inner struct {
	Name    string         `json:"name"`
	Options map[string]any `json:"options"`
}

// The values of side and corrupt_in.
const (
	SideDial   = "dial"
	SideListen = "listen"
	SideBoth   = "both"

	CorruptPayload = "payload"
	CorruptFrame   = "frame"
)

// frameNames are the frame types the frames option may list: those the
// engine sends. Ping and Pong never leave the wrapped transport.
var frameNames = map[string]kernel.FrameType{
	"request":  kernel.FrameRequest,
	"response": kernel.FrameResponse,
	"cancel":   kernel.FrameCancel,
	"goaway":   kernel.FrameGoAway,
	// A stream's messages and half-close, and the credit granted for them.
	"stream_data":   kernel.FrameStreamData,
	"window_update": kernel.FrameWindowUpdate,
}

// DefaultOptions returns the options a config without an options block
// gets: tcp-lv with its defaults, and no fault at all.
func DefaultOptions() *Options {
	return &Options{
		Transport: Inner{Name: "tcp-lv"},
		Seed:      1,
		Side:      SideBoth,
		Frames:    []string{"request", "response", "cancel"},
		CorruptIn: CorruptPayload,
	}
}

func optionError(key, format string, args ...any) error {
	return fmt.Errorf("faulty: option %q: "+format, append([]any{key}, args...)...)
}

func (o *Options) validate() error {
	if o.Transport.Name == "" {
		return optionError("transport.name", "must name the transport to wrap, such as tcp-lv or shm-ring")
	}
	switch o.Side {
	case SideDial, SideListen, SideBoth:
	default:
		return optionError("side", "is %q; want dial, listen or both", o.Side)
	}
	if len(o.Frames) == 0 {
		return optionError("frames", "is empty; list the frame types to affect (%s)", knownFrames())
	}
	for _, name := range o.Frames {
		if _, ok := frameNames[name]; !ok {
			return optionError("frames", "has %q; want some of %s", name, knownFrames())
		}
	}
	if o.CorruptIn != CorruptPayload && o.CorruptIn != CorruptFrame {
		return optionError("corrupt_in", "is %q; want payload or frame", o.CorruptIn)
	}
	for _, d := range []struct {
		key string
		v   kernel.Duration
	}{{"delay", o.Delay}, {"delay_jitter", o.DelayJitter}} {
		if d.v < 0 {
			return optionError(d.key, "must not be negative, got %s", d.v)
		}
	}
	for _, p := range []struct {
		key string
		v   float64
	}{{"drop", o.Drop}, {"duplicate", o.Duplicate}, {"corrupt", o.Corrupt}, {"truncate", o.Truncate}, {"reset", o.Reset}} {
		if !(p.v >= 0 && p.v <= 1) { // NaN fails both
			return optionError(p.key, "is a probability per frame, from 0 to 1; got %v", p.v)
		}
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"reset_after", o.ResetAfter}, {"stall_after", o.StallAfter}} {
		if n.v < 0 {
			return optionError(n.key, "counts frames and must not be negative (0 turns it off), got %d", n.v)
		}
	}
	return nil
}

func knownFrames() string {
	names := make([]string, 0, len(frameNames))
	for n := range frameNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// faultsOn reports whether o injects any fault at all.
func (o *Options) faultsOn() bool {
	return o.Blackhole || o.Delay > 0 || o.DelayJitter > 0 || o.Drop > 0 || o.Duplicate > 0 || o.Corrupt > 0 ||
		o.Truncate > 0 || o.Reset > 0 || o.ResetAfter > 0 || o.StallAfter > 0
}

// delay draws how long one affected frame is held back.
func (o *Options) delay(r float64) time.Duration {
	return o.Delay.D() + time.Duration(r*float64(o.DelayJitter.D()))
}

// innerError turns the wrapped transport's build error into one about the
// transport option, naming the wrapped plugin and its own option once. It
// does not wrap the cause: the kernel would take the wrapped plugin's
// option for one of faulty's.
func innerError(err error) error {
	var pe *kernel.PluginError
	if errors.As(err, &pe) {
		return optionError("transport", "%s", pe.Detail())
	}
	return optionError("transport", "%v", err)
}
