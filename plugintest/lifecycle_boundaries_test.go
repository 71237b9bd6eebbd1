package plugintest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Defects the lifecycle and options checks once let through: a Close that
// is idempotent only one call at a time, option errors that "name" a key
// by containing its word, and options kept in a map.
func TestLifecycleCatchesBoundaryDefects(t *testing.T) {
	cases := []struct {
		name    string
		factory kernel.Factory[kernel.Codec]
		path    string
	}{
		{"close is idempotent only one call at a time", lifecycleFactory(func(*lifecycleOptions) (kernel.Codec, error) {
			return &lifecycleRacyCloser{done: make(chan struct{})}, nil
		}), "Plugin/Lifecycle/CloseConcurrently"},
		{"a wrong type is refused by a message that merely contains the key's word", kernel.NewFactory("lifecycle", "",
			func() *lifecycleWordyOptions { return &lifecycleWordyOptions{Level: 1} },
			func(*lifecycleWordyOptions) (kernel.Codec, error) { return &lifecycleCodec{}, nil }),
			"Plugin/Options/WrongType"},
		{"an unknown key is refused without saying which", kernel.NewFactory("lifecycle", "",
			func() *lifecycleHandDecoded { return &lifecycleHandDecoded{Level: 1} },
			func(*lifecycleHandDecoded) (kernel.Codec, error) { return &lifecycleCodec{}, nil }),
			"Plugin/Options/UnknownKey"},
		{"options kept in a map, with options configured", kernel.Factory[kernel.Codec]{
			Name:       "lifecycle",
			NewOptions: func() any { return &map[string]any{"level": 1} },
			New:        func(any) (kernel.Codec, error) { return &lifecycleCodec{}, nil },
		}, "Plugin/Options/WrongType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			expectCaught(t, lifecycleRecord(t, tc.factory), tc.path)
		})
	}
}

// An option error names its key by the kernel's structured key or by the
// kernel's shape, option "KEY"; containing the word is not enough.
func TestOptionNamed(t *testing.T) {
	decode := func(tree map[string]any) error {
		var o struct {
			Size  kernel.Size `json:"size"`
			Level int         `json:"level"`
		}
		return kernel.DecodeOptions(tree, &o)
	}
	cases := []struct {
		err  error
		key  string
		want bool
	}{
		{decode(map[string]any{"size": []any{true}}), "size", true},
		{decode(map[string]any{"siz": 1}), "siz", true},
		{decode(map[string]any{"siz": 1}), "size", false}, // the message lists size among the known keys
		{&kernel.PluginError{Kind: kernel.KindCodec, Name: "c", Err: decode(map[string]any{"level": "x"})}, "level", true},
		{&kernel.PluginError{Kind: kernel.KindCodec, Name: "c", Key: "level", Err: errors.New("bad")}, "level", true},
		{&kernel.PluginError{Kind: kernel.KindCodec, Name: "c", Key: "label", Err: errors.New(`option "level" is bad`)}, "level", false},
		{fmt.Errorf(`tcp-lv: option %q: must be positive`, "keepalive_interval"), "keepalive_interval", true},
		{errors.New("not a size"), "size", false},
		{errors.New("bad size for option size"), "size", false},
		{errors.New(`option "max_size": too big`), "size", false},
	}
	for _, c := range cases {
		if got := optionNamed(c.err, c.key); got != c.want {
			t.Errorf("optionNamed(%q, %q) = %v, want %v", c.err, c.key, got, c.want)
		}
	}
}

// lifecycleRacyCloser checks that it is open, then takes its time before
// closing: two Close calls at once both get past the check.
type lifecycleRacyCloser struct {
	lifecycleCodec
	closing atomic.Bool
	done    chan struct{}
}

func (c *lifecycleRacyCloser) Close() error {
	if c.closing.Load() {
		return nil
	}
	time.Sleep(20 * time.Millisecond) // flushing, say
	close(c.done)
	c.closing.Store(true)
	return nil
}

// lifecycleWordyOptions decodes itself and refuses a bad value with a
// message that has the word size in it, and no key. (An UnmarshalJSON of
// the field's own type would not do: the kernel finds the key its error
// is about, and names it.)
type lifecycleWordyOptions struct {
	Level int `json:"level"`
	Size  int `json:"size"`
}

func (o *lifecycleWordyOptions) UnmarshalJSON(b []byte) error {
	type plain lifecycleWordyOptions
	if err := json.Unmarshal(b, (*plain)(o)); err != nil {
		return errors.New("not a valid size")
	}
	return nil
}

// lifecycleHandDecoded decodes itself strictly, but says only that some
// key is unknown, listing the known ones.
type lifecycleHandDecoded struct {
	Level int    `json:"level"`
	Label string `json:"label"`
}

func (o *lifecycleHandDecoded) UnmarshalJSON(b []byte) error {
	var tree map[string]json.RawMessage
	if err := json.Unmarshal(b, &tree); err != nil {
		return err
	}
	known := []string{"label", "level"}
	for k := range tree {
		if !slices.Contains(known, k) {
			return errors.New("unknown key (known keys: " + strings.Join(known, ", ") + ")")
		}
	}
	type plain lifecycleHandDecoded
	dec := json.NewDecoder(bytes.NewReader(b))
	return dec.Decode((*plain)(o))
}
