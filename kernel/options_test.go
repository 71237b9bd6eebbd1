package kernel

import (
	"encoding/json"
	"log/slog"
	"reflect"
	"slices"
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
