package plugintest

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// optionNamed reports whether err names the option key precisely: by the
// key strict decoding reports (kernel.OptionKey, or kernel.PluginError's
// Key), or, when the error carries none, by the kernel's own shape,
// option "KEY", in its message. A message that merely contains the key's
// name does not count: an option called "size" would be "named" by any
// message with the word size in it. A path inside the key names it too:
// strict decoding names a bad element of a list option "zones[0]".
func optionNamed(err error, key string) bool {
	if k := kernel.OptionKey(err); k != "" {
		return keyOrInside(k, key)
	}
	var pe *kernel.PluginError
	if errors.As(err, &pe) && pe.Key != "" {
		return keyOrInside(pe.Key, key)
	}
	return strings.Contains(err.Error(), "option "+strconv.Quote(key))
}

// keyOrInside reports whether path is key, or a path inside it: an element
// ("key[2]") or a key of its mapping ("key.name").
func keyOrInside(path, key string) bool {
	rest, ok := strings.CutPrefix(path, key)
	return ok && (rest == "" || rest[0] == '[' || rest[0] == '.')
}

// optionNamingRule says how an option error names its key, for messages.
func optionNamingRule(key string) string {
	return fmt.Sprintf("an option error names its key as the kernel's do: return the error of kernel.DecodeOptions (which builds a Factory's options), "+
		"or say option %q in the message as kernel.PluginError does; a message that merely contains the word does not name the key", key)
}

// optionTypo returns a typo of one of keys (the first long enough, its
// last letter dropped) that is not itself a key; "" if there is none.
func optionTypo(keys []string) string {
	for _, k := range keys {
		if typo := k[:max(len(k)-1, 0)]; len(k) >= 4 && !slices.Contains(keys, typo) {
			return typo
		}
	}
	return ""
}

// lifecycleCloseConcurrently closes p from two goroutines at once, as a
// server shutting down and a failing component might: neither may panic
// or fail with anything but kernel.ErrClosed, and one of them, the first,
// returns nil. A plugin without Close has nothing to check.
func lifecycleCloseConcurrently(t tb, p any) {
	t.Helper()
	c, ok := p.(io.Closer)
	if !ok {
		return
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]string, 2) // "" for nil
	for i := range results {
		wg.Go(func() {
			defer func() {
				if v := recover(); v != nil {
					results[i] = fmt.Sprintf("panicked: %v", v)
				}
			}()
			<-start
			if err := c.Close(); err != nil {
				results[i] = "returned " + err.Error()
				if errors.Is(err, kernel.ErrClosed) {
					results[i] = "closed"
				}
			}
		})
	}
	close(start)
	const patience = 10 * time.Second
	if _, ok := transportDo(t, patience, func() struct{} { wg.Wait(); return struct{}{} }); !ok {
		t.Fatalf("two Close calls at once did not both return within %s", patience)
	}
	for _, r := range results {
		if r != "" && r != "closed" {
			t.Errorf("Close, called from two goroutines at once, %s; want nil, or an error wrapping kernel.ErrClosed from the one that came second", r)
		}
	}
	if results[0] == "closed" && results[1] == "closed" {
		t.Errorf("Close, called from two goroutines at once, failed with kernel.ErrClosed in both; the first Close of a plugin returns nil")
	}
}
