package kernel

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// diffOptions has, beside plain kinds, those the fast path leaves to
// encoding/json, and slices, maps and pointers that start out filled, as
// a plugin's defaults do: the fast path must decode into them exactly as
// encoding/json does, or leave them to it.
type diffOptions struct {
	Small    int8                 `json:"small"`
	Unsigned uint16               `json:"unsigned"`
	Ratio    float64              `json:"ratio"`
	Ratio32  float32              `json:"ratio32"`
	Name     string               `json:"name"`
	On       bool                 `json:"on"`
	Any      any                  `json:"any"`
	Limit    *Duration            `json:"limit"`
	Count    *int                 `json:"count"`
	Size     Size                 `json:"size"`
	Rules    []diffRule           `json:"rules"`
	ByName   map[diffKey]diffRule `json:"by_name"`
	Tags     []string             `json:"tags"`
	Quoted   int                  `json:"quoted,string"`
	Folded   string               `json:"Folded"`
	Inner    diffInner            `json:"inner"`
	Bytes    []byte               `json:"bytes"`
	Fixed    [2]int               `json:"fixed"`
	Text     diffText             `json:"text"`
	Number   json.Number          `json:"number"`
	Untagged string
	Skipped  string `json:"-"`
	hidden   string
}

type diffRule struct {
	Code  Code              `json:"code"`
	Tries int               `json:"tries"`
	Tags  map[string]string `json:"tags"`
	Next  *diffRule         `json:"next"`
}

type diffKey string

// diffInner embeds a struct, whose keys encoding/json promotes.
type diffInner struct {
	diffRule
	Own string `json:"own"`
}

// diffText decodes from a string through encoding.TextUnmarshaler.
type diffText struct{ upper string }

func (d *diffText) UnmarshalText(b []byte) error {
	d.upper = strings.ToUpper(string(b))
	return nil
}

// diffDefaults fills what a plugin's defaults might, including a slice
// whose capacity holds elements past its length.
func diffDefaults() *diffOptions {
	limit, count := Duration(5e9), 7
	rules := []diffRule{{Code: Unavailable, Tries: 3, Tags: map[string]string{"a": "b"}}, {Code: Internal, Tries: 9}, {Tries: 4}}
	return &diffOptions{
		Name: "default", Limit: &limit, Count: &count, Rules: rules[:1],
		ByName: map[diffKey]diffRule{"kept": {Tries: 1}}, Tags: []string{"x", "y"},
		hidden: "h", Skipped: "s",
	}
}

// checkSameAsJSON decodes tree through DecodeOptions and through
// encoding/json alone, from the same defaults, and fails unless both give
// the same options or the same error. It reports whether the fast path
// decoded the tree by itself.
func checkSameAsJSON(t *testing.T, tree map[string]any) (fast bool) {
	t.Helper()
	probe := diffDefaults()
	fast = setFromTree(tree, probe)
	got, want := diffDefaults(), diffDefaults()
	gotErr, wantErr := DecodeOptions(tree, got), decodeOptionsJSON(tree, want)
	switch {
	case (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error():
		t.Fatalf("tree %v: DecodeOptions says %v; encoding/json says %v", tree, gotErr, wantErr)
	case gotErr == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("tree %v: DecodeOptions gives %+v; encoding/json gives %+v", tree, got, want)
	case fast && !reflect.DeepEqual(probe, want):
		t.Fatalf("tree %v: the fast path alone gives %+v; encoding/json gives %+v", tree, probe, want)
	}
	return fast
}

func TestDecodeOptionsFastPathDecodesAsJSONDoes(t *testing.T) {
	fast := []map[string]any{
		{"small": -128, "unsigned": 65535, "ratio": 0.25, "name": "n", "on": true},
		{"small": 12.0, "unsigned": json.Number("7"), "ratio": json.Number("1e3"), "size": "4MiB"},
		{"limit": "250ms", "count": 3, "rules": []any{map[string]any{"tries": 5}}},
		{"rules": []any{map[string]any{"code": "Unavailable"}, map[string]any{"code": "Internal", "next": map[string]any{"tries": 2}}, map[string]any{}}},
		{"rules": []any{}, "tags": []any{"only"}},
		{"by_name": map[string]any{"kept": map[string]any{"code": "Internal"}, "new": map[string]any{"tags": map[string]any{"k": "v"}}}},
		{"Untagged": "u", "bytes": []any{1, 2, 255}},
		{"limit": 0, "size": 1024, "count": int64(-1)},
		{"unsigned": uint64(3), "ratio": int64(1 << 40), "count": math.MaxInt},
	}
	for _, tree := range fast {
		if err := DecodeOptions(tree, diffDefaults()); err != nil {
			t.Fatalf("tree %v: %v", tree, err)
		}
		if !checkSameAsJSON(t, tree) {
			t.Errorf("tree %v: left to encoding/json; the fast path should decode it", tree)
		}
	}
	slow := []map[string]any{
		{"ratio32": 0.5},                      // float32: a second rounding
		{"any": map[string]any{"n": 1}},       // an interface: JSON's own shapes
		{"quoted": "12"},                      // ",string"
		{"folded": "case differs"},            // encoding/json folds case
		{"inner": map[string]any{"tries": 1}}, // promoted from an embedded struct
		{"bytes": "AAE="},                     // base64
		{"fixed": []any{1, 2}},                // an array
		{"text": "abc"},                       // encoding.TextUnmarshaler
		{"name": nil},                         // null
		{"tags": []any(nil)},                  // null too
		{"by_name": map[string]any(nil)},      // null too
		{"rules": []any{map[string]any(nil)}}, // null too
		{"number": "not a number"},            // encoding/json checks a json.Number
		{"number": json.Number("12")},
		{"name": "bad \xff utf-8"},                   // encoding/json replaces it
		{"count": float64(1 << 60)},                  // JSON writes it rounded
		{"rules": []any{map[string]any{"code": 14}}}, // a code by number
		{"ratio": json.Number("+1")},                 // no JSON number
		{"limit": []any{"5s"}},                       // a list for a duration
		{"tags": []any{"a", 1}},                      // a number in a list of strings
		{"small": 300}, {"unsigned": -1}, {"small": 1.5}, {"on": "true"},
		{"unsigned": math.Copysign(0, -1)}, // JSON writes -0, which no unsigned takes
		{"unknown": 1}, {"Skipped": "s"}, {"hidden": "h"}, {"size": "4 parsecs"},
		{"rules": []any{map[string]any{"tries": 1}, map[string]any{"tries": "x"}}},
		{"by_name": map[string]any{"k": map[string]any{"unknown": true}}},
		{"ratio": math.Inf(1)}, {"name": make(chan int)},
	}
	for _, tree := range slow {
		if checkSameAsJSON(t, tree) {
			t.Errorf("tree %v: decoded by the fast path; it should be left to encoding/json", tree)
		}
	}
}

// A client made for one call decodes its registry's options on every
// call: the fast path must cost a fraction of the JSON round trip.
func TestDecodeOptionsFastPathAllocatesLittle(t *testing.T) {
	tree := map[string]any{"rules": []any{map[string]any{"code": "Unavailable", "tags": map[string]any{"a": "b"}}}, "limit": "1s"}
	fast := testing.AllocsPerRun(100, func() { _ = DecodeOptions(tree, diffDefaults()) })
	slow := testing.AllocsPerRun(100, func() { _ = decodeOptionsJSON(tree, diffDefaults()) })
	if fast*2 > slow {
		t.Fatalf("DecodeOptions allocates %.0f times; encoding/json %.0f: the fast path is not taken, or costs as much", fast, slow)
	}
}

// yamlShaped turns the json.Numbers of a tree into the integers and floats
// a YAML config's parser makes.
func yamlShaped(x any) any {
	switch x := x.(type) {
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			return int(n)
		}
		if n, err := strconv.ParseUint(string(x), 10, 64); err == nil {
			return n
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = yamlShaped(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = yamlShaped(e)
		}
		return out
	}
	return x
}

// BenchmarkDecodeOptions decodes the options a client made for one call
// gives its memory registry, through DecodeOptions and through
// encoding/json alone.
func BenchmarkDecodeOptions(b *testing.B) {
	type staticOptions struct {
		Static map[string][]string `json:"static"`
		TTL    Duration            `json:"ttl"`
	}
	tree := map[string]any{"static": map[string]any{"echo": []any{"127.0.0.1:7000"}}}
	for _, bc := range []struct {
		name   string
		decode func(map[string]any, any) error
	}{{"DecodeOptions", DecodeOptions}, {"json", decodeOptionsJSON}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var o staticOptions
				if err := bc.decode(tree, &o); err != nil || len(o.Static["echo"]) != 1 {
					b.Fatalf("%+v, %v", o, err)
				}
			}
		})
	}
}
