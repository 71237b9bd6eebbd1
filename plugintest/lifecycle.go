package plugintest

import (
	"errors"
	"io"
	"reflect"
	"sort"

	"github.com/kernrpc/kernrpc/kernel"
)

// lifecycle runs the subtests every plugin kind shares: Lifecycle (close
// without use, close twice, use-close-use on a fresh instance) and Options
// (defaults decode, unknown keys and wrong types are refused by name).
// options is the config block the suite builds the plugin from; use
// exercises one built plugin briefly and reports failures through t.
func lifecycle[T any](t tb, f kernel.Factory[T], options map[string]any, use func(t tb, p T)) {
	t.Run("Lifecycle", func(t tb) {
		t.Run("CloseWithoutUse", func(t tb) {
			p := build(t, f, options)
			if err := closePlugin(p); err != nil {
				t.Errorf("Close of a plugin never used: %v; want nil", err)
			}
		})
		t.Run("CloseTwice", func(t tb) {
			p := build(t, f, options)
			if err := closePlugin(p); err != nil {
				t.Fatalf("first Close: %v; want nil", err)
			}
			if err := closePlugin(p); err != nil && !errors.Is(err, kernel.ErrClosed) {
				t.Errorf("second Close: %v; want nil or an error wrapping kernel.ErrClosed", err)
			}
		})
		t.Run("CloseConcurrently", func(t tb) {
			p := build(t, f, options)
			lifecycleCloseConcurrently(t, p)
		})
		t.Run("UseCloseUse", func(t tb) {
			first := build(t, f, options)
			use(t, first)
			if err := closePlugin(first); err != nil {
				t.Fatalf("Close after use: %v; want nil", err)
			}
			second := build(t, f, options)
			defer closePlugin(second)
			use(t, second)
		})
	})
	t.Run("Options", func(t tb) { optionsSuite(t, f, options) })
}

func optionsSuite[T any](t tb, f kernel.Factory[T], options map[string]any) {
	t.Run("Defaults", func(t tb) {
		p, err := f.Build(nil, "plugintest")
		if err != nil {
			t.Fatalf("building %q with no options: %v; a plugin must start from its defaults", f.Name, err)
		}
		closePlugin(p)
	})
	t.Run("UnknownKey", func(t tb) {
		// A key nobody would choose, and a typo of a real key: a message
		// that lists the known keys contains the typo as a substring, so
		// only an error naming the key it is about passes.
		unknown := []string{"plugintest_no_such_key"}
		if typo := optionTypo(optionKeys(f)); typo != "" {
			unknown = append(unknown, typo)
		}
		for _, key := range unknown {
			bad := merge(options, key, true)
			p, err := f.Build(bad, "plugintest.yaml")
			if err == nil {
				closePlugin(p)
				t.Errorf("building %q with unknown option %q succeeded; options must be decoded strictly", f.Name, key)
				continue
			}
			if !optionNamed(err, key) {
				t.Errorf("the error for unknown option %q does not name it: %v; %s", key, err, optionNamingRule(key))
			}
		}
	})
	t.Run("WrongType", func(t tb) {
		keys := optionKeys(f)
		if len(keys) == 0 {
			switch {
			case f.NewOptions == nil:
				t.Skipf("%q takes no options (its Factory has no NewOptions)", f.Name)
			case len(options) > 0:
				t.Fatalf("the suite is configured with options %v, but %q declares no key a value of the wrong type could go to (NewOptions returns %T): "+
					"declare the options as a struct with json tags, which strict decoding checks key by key", options, f.Name, f.NewOptions())
			default:
				t.Skipf("%q takes no options (NewOptions returns %T, a struct without keys)", f.Name, f.NewOptions())
			}
		}
		// Nested arrays of booleans fit no scalar, map or struct option, so
		// every key must refuse them and say which key it was.
		wrong := []any{[]any{true}}
		for _, key := range keys {
			p, err := f.Build(merge(options, key, wrong), "plugintest.yaml")
			if err == nil {
				closePlugin(p)
				t.Errorf("option %q accepted the value [[true]]; want an error naming %q", key, key)
				continue
			}
			if !optionNamed(err, key) {
				t.Errorf("the error for a wrong type in option %q does not name it: %v; %s", key, err, optionNamingRule(key))
			}
		}
	})
}

// build makes one plugin from f and options, failing t if it cannot.
func build[T any](t tb, f kernel.Factory[T], options map[string]any) T {
	t.Helper()
	p, err := f.Build(options, "plugintest")
	if err != nil {
		t.Fatalf("building %q: %v", f.Name, err)
	}
	return p
}

// closePlugin closes p if it holds resources (implements io.Closer).
func closePlugin(p any) error {
	if c, ok := p.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// optionKeys lists the keys of f's options, as the config spells them;
// options of interface type are left out, since they accept every value.
func optionKeys[T any](f kernel.Factory[T]) []string {
	if f.NewOptions == nil {
		return nil
	}
	var keys []string
	for key, typ := range kernel.OptionFields(f.NewOptions()) {
		if typ.Kind() != reflect.Interface {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	return keys
}

func merge(options map[string]any, key string, value any) map[string]any {
	out := make(map[string]any, len(options)+1)
	for k, v := range options {
		out[k] = v
	}
	out[key] = value
	return out
}
