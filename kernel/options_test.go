package kernel

import (
	"encoding/json"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "4KiB": 4096, "4 MiB": 4 << 20, "1GB": 1e9, "12B": 12} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "4XB", "1.5MiB", "99999999999GiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) succeeded; want an error", in)
		}
	}
}

// Sizes stop at 2^62 however they are written: a larger integer would
// print as a count of GiB that does not parse back.
func TestSizeOverTheBoundIsRefused(t *testing.T) {
	for _, in := range []string{"9223372035781033984", `"4294967297GiB"`, "4611686018427387905"} {
		var s Size
		if err := json.Unmarshal([]byte(in), &s); err == nil {
			t.Errorf("%s decoded as %d; want an error", in, s)
		}
	}
	var s Size
	if err := json.Unmarshal([]byte("4611686018427387904"), &s); err != nil || s.String() != "4294967296GiB" {
		t.Errorf("2^62 decoded as %v, %v; want 4294967296GiB", s, err)
	}
}

// An integer too large, or too negative, for any int64 is refused for its
// range, as one just past 2^62 is, not as if it were no integer at all.
func TestSizeBeyondAnyIntegerSaysSo(t *testing.T) {
	for in, want := range map[string]string{
		"99999999999999999999":  "size 99999999999999999999 is over the largest a config may hold, 4611686018427387904 (2^62)",
		"-99999999999999999999": "size -99999999999999999999 must not be negative",
	} {
		var s Size
		err := DecodeOptions(map[string]any{"size": json.Number(in)}, &struct {
			Size *Size `json:"size"`
		}{&s})
		if err == nil || err.Error() != want || OptionKey(err) != "size" {
			t.Errorf("%s: %v (key %q); want key \"size\", %q", in, err, OptionKey(err), want)
		}
	}
}

func TestSizeAndDurationRoundTripThroughJSON(t *testing.T) {
	type opts struct {
		S Size     `json:"s"`
		D Duration `json:"d"`
	}
	for _, in := range []opts{{4 << 20, Duration(5 * time.Second)}, {65536, Duration(250 * time.Millisecond)}, {1000, 0}, {0, Duration(time.Hour)}} {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var out opts
		if err := json.Unmarshal(b, &out); err != nil || out != in {
			t.Errorf("%+v -> %s -> %+v, %v", in, b, out, err)
		}
	}
	if b, _ := json.Marshal(Size(4 << 20)); string(b) != `"4MiB"` {
		t.Errorf("4 MiB marshals as %s, want \"4MiB\"", b)
	}
}

func TestOptionFieldsYieldsConfigKeysWithTheirTypes(t *testing.T) {
	type opts struct {
		Rate    int          `json:"rate"`
		Window  Duration     `json:"window,omitempty"`
		Logger  *slog.Logger `json:"-"`
		Plain   string
		private bool //lint:ignore U1000 there to show OptionFields skips unexported fields
		Any     any  `json:"any"`
	}
	got := map[string]reflect.Type{}
	var order []string
	for k, typ := range OptionFields(&opts{}) {
		got[k] = typ
		order = append(order, k)
	}
	want := []string{"rate", "window", "Plain", "any"}
	if !slices.Equal(order, want) {
		t.Fatalf("keys = %v, want %v (json names, field order, without '-' and unexported fields)", order, want)
	}
	if got["window"] != reflect.TypeFor[Duration]() || got["any"].Kind() != reflect.Interface {
		t.Errorf("types = %v; want Duration for window and an interface for any", got)
	}
	for range OptionFields(42) {
		t.Fatal("a non-struct yielded a key")
	}
}

// encoding/json matches a key to a field whatever its case; options do
// not: "Max_Size" is refused, naming the key it means, and so is a second
// spelling of a key beside the first, which would override it.
func TestOptionKeysAreCaseSensitive(t *testing.T) {
	type inner struct {
		Name string `json:"name"`
	}
	type opts struct {
		MaxSize Size              `json:"max_size"`
		Inner   inner             `json:"inner"`
		Byname  map[string]inner  `json:"byname"`
		List    []inner           `json:"list"`
		Free    map[string]string `json:"free"`
	}
	for _, tc := range []struct {
		tree      map[string]any
		key, want string
	}{
		{map[string]any{"Max_Size": "1KiB"}, "Max_Size", `did you mean "max_size"?`},
		{map[string]any{"max_size": "1KiB", "MAX_SIZE": "2KiB"}, "MAX_SIZE", `did you mean "max_size"?`},
		{map[string]any{"inner": map[string]any{"Name": "x"}}, "inner.Name", `did you mean "name"?`},
		{map[string]any{"byname": map[string]any{"a": map[string]any{"NAME": "x"}}}, "byname.a.NAME", `did you mean "name"?`},
		{map[string]any{"list": []any{map[string]any{"name": "x"}, map[string]any{"nAme": "y"}}}, "list[1].nAme", `did you mean "name"?`},
	} {
		err := DecodeOptions(tc.tree, &opts{})
		if OptionKey(err) != tc.key || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (key %q); want key %q, %s", tc.tree, err, OptionKey(err), tc.key, tc.want)
		}
	}
	// A map's own keys are data, whatever their case.
	var o opts
	if err := DecodeOptions(map[string]any{"free": map[string]any{"Key": "v", "KEY": "w"}, "max_size": "1KiB"}, &o); err != nil || o.Free["Key"] != "v" || o.Free["KEY"] != "w" {
		t.Errorf("a map's keys of any case: %v, %v", err, o.Free)
	}
}

// A null (in YAML, a key left blank) leaves an option as it was, as
// encoding/json leaves a field it decodes null into: the plugin's default
// stays, whatever the option's type. A Size must not turn into 0, nor a
// Duration or a Code into an error about an empty string nobody wrote.
func TestNullLeavesAnOptionAsItWas(t *testing.T) {
	type opts struct {
		Size   Size     `json:"size"`
		Window Duration `json:"window"`
		Code   Code     `json:"code"`
		Count  int      `json:"count"`
	}
	defaults := opts{Size: 4 << 20, Window: Duration(5 * time.Second), Code: Unavailable, Count: 3}
	for _, key := range []string{"size", "window", "code", "count"} {
		got := defaults
		if err := DecodeOptions(map[string]any{key: nil}, &got); err != nil || got != defaults {
			t.Errorf("%s: null: %+v, %v; want the defaults %+v kept", key, got, err, defaults)
		}
	}
}

// A number that is an integer, but too large (or negative) for its
// option, is refused for its range, not as if it were no integer at all.
func TestNumberOutOfRangeSaysSo(t *testing.T) {
	type opts struct {
		Small int8    `json:"small"`
		UID   uint32  `json:"uid"`
		Count int     `json:"count"`
		Ratio float32 `json:"ratio"`
	}
	for _, tc := range []struct {
		tree      map[string]any
		key, want string
	}{
		{map[string]any{"small": 300}, "small", "300 is out of range: want an integer from -128 to 127"},
		{map[string]any{"uid": -1}, "uid", "-1 is out of range: want an integer from 0 to 4294967295"},
		{map[string]any{"count": json.Number("100000000000000000000")}, "count", "100000000000000000000 is out of range: want an integer from -9223372036854775808 to 9223372036854775807"},
		{map[string]any{"ratio": 1e39}, "ratio", "1e+39 is out of range: want a number of magnitude at most 3.4028234663852886e+38"},
		{map[string]any{"count": 1.5}, "count", "wrong type: got a number 1.5, want an integer"},
	} {
		err := DecodeOptions(tc.tree, &opts{})
		if OptionKey(err) != tc.key || err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v (key %q); want key %q, %q", tc.tree, err, OptionKey(err), tc.key, tc.want)
		}
	}
}

// A value of the wrong type in a list or a map is named by its index or
// its key, as an unknown key there is: in a config with several filters,
// "filters.methods" does not say which filter.
func TestWrongTypeNamesTheElement(t *testing.T) {
	type rule struct {
		Tries int `json:"tries"`
	}
	type opts struct {
		Rules  []rule          `json:"rules"`
		ByName map[string]rule `json:"by_name"`
		Tags   []string        `json:"tags"`
		Sizes  map[string]Size `json:"sizes"`
		Nested [][]int         `json:"nested"`
	}
	for _, tc := range []struct {
		tree map[string]any
		key  string
	}{
		{map[string]any{"rules": []any{map[string]any{"tries": 1}, map[string]any{"tries": "x"}}}, "rules[1].tries"},
		{map[string]any{"rules": []any{map[string]any{}, 5}}, "rules[1]"},
		{map[string]any{"by_name": map[string]any{"a": map[string]any{"tries": 1}, "b": map[string]any{"tries": true}}}, "by_name.b.tries"},
		{map[string]any{"tags": []any{"a", "b", 3}}, "tags[2]"},
		{map[string]any{"sizes": map[string]any{"a": "1KiB", "b": "huge"}}, "sizes.b"},
		{map[string]any{"nested": []any{[]any{1}, []any{2, "x"}}}, "nested[1][1]"},
		{map[string]any{"tags": "a"}, "tags"},
	} {
		err := DecodeOptions(tc.tree, &opts{})
		if err == nil || OptionKey(err) != tc.key {
			t.Errorf("%v: %v (key %q); want key %q", tc.tree, err, OptionKey(err), tc.key)
		}
	}
}

// An embedded struct's fields are options of the struct that embeds it,
// as encoding/json promotes them: they are keys of their own, case-
// sensitive like any other, listed among the known keys, and an error
// about one names it as the config wrote it.
func TestEmbeddedOptionsAreKeysOfTheirOwn(t *testing.T) {
	type common struct {
		Timeout Duration `json:"timeout"`
	}
	type Shared struct {
		Limit int `json:"limit"`
	}
	type opts struct {
		common
		*Shared
		Rate int `json:"rate"`
	}
	var keys []string
	for k := range OptionFields(&opts{}) {
		keys = append(keys, k)
	}
	if want := []string{"timeout", "limit", "rate"}; !slices.Equal(keys, want) {
		t.Errorf("OptionFields = %v, want %v: an embedded struct's fields, not the struct", keys, want)
	}
	for _, tc := range []struct {
		tree      map[string]any
		key, want string
	}{
		{map[string]any{"TIMEOUT": "1s"}, "TIMEOUT", `did you mean "timeout"?`},
		{map[string]any{"timeout": "1s", "Timeout": "2s"}, "Timeout", `did you mean "timeout"?`},
		{map[string]any{"Limit": 3}, "Limit", `did you mean "limit"?`},
		{map[string]any{"timeot": "1s"}, "timeot", "unknown key (known keys: limit, rate, timeout)"},
		{map[string]any{"timeout": 5}, "timeout", "duration 5 must be a string"},
		{map[string]any{"limit": "x"}, "limit", "wrong type: got a string, want an integer"},
	} {
		err := DecodeOptions(tc.tree, &opts{})
		if OptionKey(err) != tc.key || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (key %q); want key %q, %s", tc.tree, err, OptionKey(err), tc.key, tc.want)
		}
	}
	var o opts
	if err := DecodeOptions(map[string]any{"timeout": "1s", "limit": 3}, &o); err != nil || o.Timeout.D() != time.Second || o.Shared == nil || o.Limit != 3 {
		t.Errorf("embedded options: %+v, %v", o, err)
	}
}

// probeMode is an option type of a plugin's own, with an UnmarshalJSON
// that refuses what it does not know by a plain error.
type probeMode string

func (m *probeMode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil || s != "fast" && s != "slow" {
		return errors.New("want fast or slow")
	}
	*m = probeMode(s)
	return nil
}

// A plugin's own type that refuses a value in its UnmarshalJSON with an
// error of its own is named by its key too, as a Duration or a Size is:
// encoding/json hands such an error back without saying where.
func TestAnUnmarshalerErrorNamesTheKey(t *testing.T) {
	type rule struct {
		Mode probeMode `json:"mode"`
	}
	type opts struct {
		Mode  probeMode `json:"mode"`
		Rules []rule    `json:"rules"`
	}
	for _, tc := range []struct {
		tree map[string]any
		key  string
	}{
		{map[string]any{"mode": "medium"}, "mode"},
		{map[string]any{"mode": "fast", "rules": []any{map[string]any{"mode": "slow"}, map[string]any{"mode": 3}}}, "rules[1].mode"},
	} {
		err := DecodeOptions(tc.tree, &opts{})
		if err == nil || OptionKey(err) != tc.key || !strings.Contains(err.Error(), "want fast or slow") {
			t.Errorf("%v: %v (key %q); want key %q and the type's own message", tc.tree, err, OptionKey(err), tc.key)
		}
	}
}
