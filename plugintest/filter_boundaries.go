package plugintest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/kernrpc/kernrpc/kernel"
)

// filterLong is the length of the long method names, metadata values and
// status messages the suite sends: past any limit a header encoding or a
// filter's buffer might have, as frames allow.
const filterLong = 16 << 10

// filterLongText returns n bytes of text with multi-byte characters, so
// that a cut counted in characters or at a fixed byte shows.
func filterLongText(prefix string, n int) string {
	return prefix + codecText(n-len(prefix))
}

// filterCallShape is one call the metadata checks make: a method and the
// request metadata it carries beyond the suite's own.
type filterCallShape struct {
	what     string
	method   string
	metadata kernel.Metadata
}

// filterUnusualMetadata is request metadata that a filter which bounds,
// splits, trims or normalises what it passes on does not pass intact.
func filterUnusualMetadata() kernel.Metadata {
	return kernel.Metadata{
		"plugintest-long":                        filterLongText("long value: ", filterLong),
		"plugintest-empty":                       "",
		"plugintest-lines":                       "first\nsecond\r\nthird\tcolumn",
		"plugintest-separators":                  "a=1; b=2, c=3 & d|e",
		"plugintest-padded":                      "  padded  ",
		"plugintest-nul":                         "before\x00after",
		"plugintest-unicode":                     "Zoë ✓ 😀 значение",
		"X-Plugintest-Upper":                     "keys keep their case",
		"plugintest-" + strings.Repeat("k", 200): "a long key",
	}
}

// filterCallShapes are the calls the metadata checks make: the plain one,
// and calls whose method names are long or unusual, each carrying the
// unusual metadata.
func filterCallShapes() []filterCallShape {
	unusual := filterUnusualMetadata()
	return []filterCallShape{
		{"", filterMethod, kernel.Metadata{"plugintest-a": "alpha", "plugintest-b": "b=1; c=2 ✓"}},
		{"a call with long and unusual metadata", filterMethod, unusual},
		{"a call of a long method", "PluginTest.Long/" + filterLongText("", filterLong), unusual},
		{"a call of a method without a dot or a slash", "PluginTestCall", unusual},
		{"a call of a method in gRPC's form", "/plugintest.v1.Service/Call_With-Unusual.chars", unusual},
		{"a call of a method with non-ASCII text and spaces", "Plugïntest Sérvice.Méthod ✓", unusual},
	}
}

// filterDescribe prints a method or value for a message, long ones by
// their ends.
func filterDescribe(s string) string { return registryShort(s) }

// filterMethods are the methods the Methods check alternates between:
// ones that share a long prefix, one that is a prefix of another, and two
// that differ only in case, so that state kept by a truncated, folded or
// partial key answers one with another's value.
func filterMethods() []string {
	prefix := "PluginTest.Methods/" + strings.Repeat("SharedPrefix", 8)
	return []string{
		prefix + "One",
		prefix + "Two",
		prefix,
		"PluginTest.Case",
		"PluginTest.CASE",
		"PluginTest.Other.Call",
	}
}

// filterMethodsCheck calls the filter for each of several methods in
// turn, three rounds over, and expects every response next produced that
// reaches a caller to be one of the caller's own method: a filter that
// keeps state per method (a cache, a breaker, a counter) must not answer
// or decide for one method with what belongs to another.
func filterMethodsCheck(t tb, e *filterEnv) {
	var produced sync.Map // *filterResp → the method next answered it for
	next := func(_ context.Context, info *kernel.CallInfo, _ any) (any, error) {
		r := &filterResp{id: info.Method}
		produced.Store(r, info.Method)
		return r, nil
	}
	methods := filterMethods()
	reached := 0
	for round := range 3 {
		for _, m := range methods {
			info := e.info()
			info.Method = m
			info.Metadata[filterMDKey] = strconv.Itoa(round) + "/" + m
			o, ok := e.invoke(t, t.Context(), info, next)
			if !ok {
				return
			}
			if o.nexts == 0 {
				if o.err != nil {
					e.rejectedPassing(t, o.err)
					return
				}
				// An answer of the filter's own: allowed, unless it is a
				// response next gave another method.
			} else {
				reached++
			}
			r, _ := o.resp.(*filterResp)
			if owner, fromNext := produced.Load(r); fromNext && owner != m {
				t.Errorf("round %d: a call of %s got the response next produced for %s; a filter keeping state per method "+
					"must key it by the whole method name (not a prefix, not folded case)", round+1, filterDescribe(m), filterDescribe(owner.(string)))
				return
			}
			if o.err != nil {
				e.checkRefusal(t, o)
				return
			}
		}
	}
	if reached == 0 {
		t.Skipf("the filter answered every call by itself, so what it passes on cannot be checked")
	}
}

// filterOptionNamed reports whether err names key the way the kernel
// does: as the Key of a *kernel.PluginError or a DecodeOptions error, or
// in the text as option "key" (the shape kernel.PluginError prints). A key
// that is an ordinary word ("size", "limit") appears in many messages
// that do not name it. A path inside key ("rules[1]") names it too, as
// in optionNamed.
func filterOptionNamed(err error, key string) bool {
	var pe *kernel.PluginError
	if errors.As(err, &pe) && keyOrInside(pe.Key, key) {
		return true
	}
	return keyOrInside(kernel.OptionKey(err), key) || strings.Contains(err.Error(), "option "+strconv.Quote(key))
}

// filterOptionShape is what a BadOptions failure message asks for.
func filterOptionShape(key string) string {
	return fmt.Sprintf("option %q", key)
}
