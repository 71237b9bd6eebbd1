package plugintest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
	"github.com/kernrpc/kernrpc/plugins/codec/protobuf"
)

// lifecycleOptions are the options of the codecs these tests build: a
// plugin kind with resources (Close) and options is what lifecycle checks.
type lifecycleOptions struct {
	Level int    `json:"level"`
	Label string `json:"label"`
}

func lifecycleDefaults() *lifecycleOptions { return &lifecycleOptions{Level: 1, Label: "x"} }

// lifecycleCodec is the protobuf codec holding a resource: once closed it
// refuses to encode. pool stands for state shared by the codecs of one
// factory, which a plugin must not let one Close break for the others.
type lifecycleCodec struct {
	protobuf.Codec
	closed  atomic.Bool
	pool    *atomic.Bool // nil: nothing shared
	onClose func(n int) error
	closes  atomic.Int32
}

func (c *lifecycleCodec) Marshal(dst []byte, v any) ([]byte, error) {
	if c.closed.Load() || (c.pool != nil && c.pool.Load()) {
		return dst, fmt.Errorf("lifecycle codec: %w", kernel.ErrClosed)
	}
	return c.Codec.Marshal(dst, v)
}

// MarshalSized refuses as Marshal does: the embedded codec's would not.
func (c *lifecycleCodec) MarshalSized(dst []byte, v any, size int) ([]byte, error) {
	if c.closed.Load() || (c.pool != nil && c.pool.Load()) {
		return dst, fmt.Errorf("lifecycle codec: %w", kernel.ErrClosed)
	}
	return c.Codec.MarshalSized(dst, v, size)
}

func (c *lifecycleCodec) Close() error {
	n := int(c.closes.Add(1))
	c.closed.Store(true)
	if c.pool != nil {
		c.pool.Store(true)
	}
	if c.onClose != nil {
		return c.onClose(n)
	}
	if n > 1 {
		return fmt.Errorf("lifecycle codec: %w", kernel.ErrClosed)
	}
	return nil
}

func lifecycleFactory(newCodec func(*lifecycleOptions) (kernel.Codec, error)) kernel.Factory[kernel.Codec] {
	return kernel.NewFactory("lifecycle", "a codec with a Close", lifecycleDefaults, newCodec)
}

func lifecycleRecord(t *testing.T, f kernel.Factory[kernel.Codec]) *recording {
	t.Helper()
	sample := codecEchoSamples()[0]
	return record(t, "Plugin", func(t tb) {
		lifecycle(t, f, map[string]any{"level": 2}, func(t tb, c kernel.Codec) { codecRoundTrip(t, c, sample) })
	})
}

func TestLifecyclePassesAGoodPlugin(t *testing.T) {
	rec := lifecycleRecord(t, lifecycleFactory(func(o *lifecycleOptions) (kernel.Codec, error) {
		if o.Level < 1 {
			return nil, fmt.Errorf("option \"level\" is %d; want at least 1", o.Level)
		}
		return &lifecycleCodec{}, nil
	}))
	codecExpectClean(t, rec)
	if why := rec.skippedUnder("Plugin"); why != "" {
		t.Errorf("a lifecycle check was skipped for a plugin with options and Close: %s", why)
	}
}

func TestLifecycleCatchesBrokenPlugins(t *testing.T) {
	cases := []struct {
		name    string
		factory kernel.Factory[kernel.Codec]
		path    string
	}{
		{"close without use fails", lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
			return &lifecycleCodec{onClose: func(int) error { return errors.New("close: never started") }}, nil
		}), "Plugin/Lifecycle/CloseWithoutUse"},
		{"second close fails with another error", lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
			return &lifecycleCodec{onClose: func(n int) error {
				if n > 1 {
					return errors.New("close: file already closed")
				}
				return nil
			}}, nil
		}), "Plugin/Lifecycle/CloseTwice"},
		{"second close panics", lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
			done := make(chan struct{})
			return &lifecycleCodec{onClose: func(int) error { close(done); return nil }}, nil
		}), "Plugin/Lifecycle/CloseTwice"},
		{"closes racing each other both report ErrClosed", lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
			// Close tears down first and asks after whether it was the
			// only one: a second, racing in meanwhile, makes both say no.
			c := &lifecycleCodec{}
			c.onClose = func(int) error {
				time.Sleep(20 * time.Millisecond)
				if c.closes.Load() > 1 {
					return fmt.Errorf("lifecycle codec: %w", kernel.ErrClosed)
				}
				return nil
			}
			return c, nil
		}), "Plugin/Lifecycle/CloseConcurrently"},
		{"closing one instance breaks the next", func() kernel.Factory[kernel.Codec] {
			var shared atomic.Bool // a package-level pool, in a real plugin
			return lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
				return &lifecycleCodec{pool: &shared}, nil
			})
		}(), "Plugin/Lifecycle/UseCloseUse"},
		{"new fails on its own defaults", lifecycleFactory(func(o *lifecycleOptions) (kernel.Codec, error) {
			if o.Level < 2 {
				return nil, fmt.Errorf("option \"level\" is %d; want at least 2", o.Level)
			}
			return &lifecycleCodec{}, nil
		}), "Plugin/Options/Defaults"},
		{"options accept unknown keys", kernel.Factory[kernel.Codec]{
			Name: "lifecycle",
			// A map decodes any key: a typo in a config goes unnoticed.
			NewOptions: func() any { return &map[string]any{"level": 1} },
			New:        func(any) (kernel.Codec, error) { return &lifecycleCodec{}, nil },
		}, "Plugin/Options/UnknownKey"},
		{"options accept a wrong type", kernel.NewFactory("lifecycle", "",
			func() *lifecycleLenientOptions { return &lifecycleLenientOptions{Level: 1} },
			func(*lifecycleLenientOptions) (kernel.Codec, error) { return &lifecycleCodec{}, nil }),
			"Plugin/Options/WrongType"},
		{"a wrong type is refused without naming the key", kernel.NewFactory("lifecycle", "",
			func() *lifecycleVagueOptions { return &lifecycleVagueOptions{Level: 1} },
			func(*lifecycleVagueOptions) (kernel.Codec, error) { return &lifecycleCodec{}, nil }),
			"Plugin/Options/WrongType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCaught(t, lifecycleRecord(t, tc.factory), tc.path)
		})
	}
}

// lifecycleLenientOptions falls back to the default for a value that does
// not parse, hiding a config mistake.
type lifecycleLenientOptions struct {
	Level lifecycleLenientInt `json:"level"`
}

type lifecycleLenientInt int

func (l *lifecycleLenientInt) UnmarshalJSON(b []byte) error {
	if n, err := strconv.Atoi(string(b)); err == nil {
		*l = lifecycleLenientInt(n)
	}
	return nil
}

// lifecycleVagueOptions decodes itself and refuses a bad value with an
// error that does not say which option it was. (An UnmarshalJSON of the
// field's own type would not do: the kernel finds the key its error is
// about, and names it.)
type lifecycleVagueOptions struct {
	Level int `json:"level"`
}

func (o *lifecycleVagueOptions) UnmarshalJSON(b []byte) error {
	type plain lifecycleVagueOptions
	if err := json.Unmarshal(b, (*plain)(o)); err != nil {
		return errors.New("not a number")
	}
	return nil
}
