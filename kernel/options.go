package kernel

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DecodeOptions decodes a parsed config tree into opts (a pointer to a
// struct with json tags) strictly: an unknown key or a wrong type is an
// error naming the key. Plugins rarely call it: the plugin table does, with the
// plugin's defaults, before New.
func DecodeOptions(tree map[string]any, opts any) error {
	if len(tree) == 0 || setFromTree(tree, opts) {
		return nil
	}
	return decodeOptionsJSON(tree, opts)
}

// decodeOptionsJSON is DecodeOptions through encoding/json, which decides
// every case and error the fast path (setFromTree) leaves to it.
func decodeOptionsJSON(tree map[string]any, opts any) error {
	data, err := json.Marshal(tree)
	if err != nil {
		return fmt.Errorf("options cannot be encoded: %w", err)
	}
	// encoding/json takes a key for a field's whatever its case, so that
	// "Service" would pass, or override "service" beside it.
	folded := func(k, field string, exact bool) bool { return field != "" && !exact }
	if k, ok := firstKey(tree, reflect.TypeOf(opts), "", folded); ok {
		return &decodeError{key: k.path, msg: fmt.Sprintf("unknown key (keys are case-sensitive: did you mean %q?)", k.field)}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	// A number decoded into an any (the options map of a plugin a config
	// names) stays a json.Number, exact, not a float64 that rounds an
	// integer beyond 2^53: a seed must reach its plugin as written.
	dec.UseNumber()
	if err := dec.Decode(opts); err != nil {
		return explainDecodeError(err, opts, tree)
	}
	return nil
}

// decodeError is a strict-decoding failure with the key it concerns.
type decodeError struct {
	key string
	msg string
	err error
}

func (e *decodeError) Error() string { return e.msg }
func (e *decodeError) Unwrap() error { return e.err }

func explainDecodeError(err error, opts any, tree map[string]any) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		// encoding/json names the fields alone, "rules.tries": find the
		// value's path, with the list index and map key that say which.
		if path, ok := badValueKey(tree, reflect.TypeOf(opts), "", "", te.Field); ok {
			te.Field = path
		}
		if te.Type == reflect.TypeFor[Duration]() || te.Type == reflect.TypeFor[Size]() || te.Type == reflect.TypeFor[Code]() {
			// Their UnmarshalJSON put the whole explanation in Value.
			return &decodeError{key: te.Field, err: err, msg: te.Value}
		}
		if msg, ok := outOfRange(te); ok {
			return &decodeError{key: te.Field, err: err, msg: msg}
		}
		return &decodeError{key: te.Field, err: err,
			msg: fmt.Sprintf("wrong type: got %s %s, want %s", article(te.Value), te.Value, describeType(te.Type))}
	}
	if key, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		key, _ = strconv.Unquote(key)
		// encoding/json names the key alone, wherever it is: find its
		// path, and the struct whose keys it is not one of.
		in := reflect.TypeOf(opts)
		if k, ok := firstKey(tree, in, "", func(k, field string, _ bool) bool { return field == "" && k == key }); ok {
			key, in = k.path, k.in
		}
		return &decodeError{key: key, err: err,
			msg: fmt.Sprintf("unknown key (known keys: %s)", strings.Join(knownKeys(reflect.New(in).Interface()), ", "))}
	}
	// An error of a type's own UnmarshalJSON, which encoding/json hands
	// back without saying where: find the value it refuses.
	if key, ok := unmarshalerKey(tree, reflect.TypeOf(opts), "", err.Error()); ok {
		return &decodeError{key: key, err: err, msg: err.Error()}
	}
	return err
}

// outOfRange explains te when it is a number of the right kind that its
// field cannot hold: an integer too large for an int8 or negative for a
// uint32, a number beyond a float32. encoding/json reports those as a
// wrong type, which tells the user that 300 is no integer.
func outOfRange(te *json.UnmarshalTypeError) (string, bool) {
	lit, ok := strings.CutPrefix(te.Value, "number ")
	if !ok {
		return "", false
	}
	switch t := te.Type; t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if !integerLiteral(lit) {
			return "", false
		}
		return fmt.Sprintf("%s is out of range: want an integer from %d to %d", lit, -1<<(t.Bits()-1), 1<<(t.Bits()-1)-1), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if !integerLiteral(lit) {
			return "", false
		}
		return fmt.Sprintf("%s is out of range: want an integer from 0 to %d", lit, ^uint64(0)>>(64-t.Bits())), true
	case reflect.Float32, reflect.Float64:
		// Any number parses as a float but for its size.
		max := math.MaxFloat64
		if t.Kind() == reflect.Float32 {
			max = math.MaxFloat32
		}
		return fmt.Sprintf("%s is out of range: want a number of magnitude at most %v", lit, max), true
	}
	return "", false
}

// integerLiteral reports whether s is a JSON number without a fraction or
// an exponent.
func integerLiteral(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func article(noun string) string {
	if noun != "" && strings.ContainsRune("aeiou", rune(noun[0])) {
		return "an"
	}
	return "a"
}

// valueError reports a config value of type t that does not parse. It is a
// *json.UnmarshalTypeError so that encoding/json fills in the key's path.
func valueError(t reflect.Type, format string, args ...any) error {
	return &json.UnmarshalTypeError{Value: fmt.Sprintf(format, args...), Type: t}
}

// OptionKey returns the config key a DecodeOptions error concerns, or "".
func OptionKey(err error) string {
	var de *decodeError
	if errors.As(err, &de) {
		return de.key
	}
	return ""
}

// describeType names what a value of t looks like in a config. Duration,
// Size and Code are not among them: their UnmarshalJSON explains itself
// (explainDecodeError).
func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

func knownKeys(opts any) []string {
	var keys []string
	for key := range OptionFields(opts) {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys
}

// OptionFields yields each key a config may set in opts (a plugin's
// options struct, or a pointer to one) with the type its value decodes
// into, in field order: the keys strict decoding knows. The fields of an
// embedded struct without a json name are keys of their own, as
// encoding/json promotes them.
func OptionFields(opts any) iter.Seq2[string, reflect.Type] {
	return func(yield func(string, reflect.Type) bool) {
		for _, f := range optionFields(reflect.TypeOf(opts)) {
			if !yield(f.name, f.typ) {
				return
			}
		}
	}
}

// optionField is a key of an options struct.
type optionField struct {
	name  string
	typ   reflect.Type
	index []int
	// at is how a *json.UnmarshalTypeError's Field spells the key: the
	// names of the embedded structs that hold it, then name.
	at string
}

// optionFields lists the keys of struct t (or a pointer to one) as
// encoding/json finds them: an embedded struct without a json name
// lends its fields, and of two fields of one name the shallower wins,
// else a tagged one alone, else neither.
func optionFields(t reflect.Type) []optionField {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	type found struct {
		optionField
		depth  int
		tagged bool
	}
	type level struct {
		typ   reflect.Type
		index []int
		at    string
	}
	var all []found
	visited := map[reflect.Type]bool{}
	next := []level{{typ: t}}
	for depth := 0; len(next) > 0; depth++ {
		current := next
		next = nil
		for _, l := range current {
			// A type met at an earlier level adds nothing; one embedded
			// twice at this level gives each of its fields twice, and so
			// neither.
			if visited[l.typ] {
				continue
			}
			for i := range l.typ.NumField() {
				f := l.typ.Field(i)
				ft := f.Type
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if !f.IsExported() && !(f.Anonymous && ft.Kind() == reflect.Struct) {
					continue
				}
				tag := f.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				index := append(slices.Clip(l.index), i)
				if name == "" && f.Anonymous && ft.Kind() == reflect.Struct {
					next = append(next, level{typ: ft, index: index, at: l.at + f.Name + "."})
					continue
				}
				all = append(all, found{optionField{name: cmp.Or(name, f.Name), typ: f.Type, index: index, at: l.at + cmp.Or(name, f.Name)}, depth, name != ""})
			}
		}
		for _, l := range current {
			visited[l.typ] = true
		}
	}
	// The dominant field of each name, as encoding/json picks it.
	var out []optionField
	for i, f := range all {
		dominant, ties := true, 0
		for j, g := range all {
			if i == j || g.name != f.name {
				continue
			}
			switch {
			case g.depth < f.depth || g.depth == f.depth && g.tagged && !f.tagged:
				dominant = false
			case g.depth == f.depth && g.tagged == f.tagged:
				ties++
			}
		}
		if dominant && ties == 0 {
			out = append(out, f.optionField)
		}
	}
	slices.SortFunc(out, func(a, b optionField) int { return slices.Compare(a.index, b.index) })
	return out
}

// Duration is a time.Duration that config files write as "500ms" or "5s".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a string such as "5s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "5s"-style strings; a bare 0 is accepted too. A
// null leaves d as it was (isNull).
func (d *Duration) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		return nil
	}
	if string(b) == "0" {
		*d = 0
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return valueError(reflect.TypeFor[Duration](), `duration %s must be a string with a unit, such as "500ms" or "5s"`, b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return valueError(reflect.TypeFor[Duration](), `bad duration %q: want a number with a unit, such as "500ms" or "5s"`, s)
	}
	*d = Duration(v)
	return nil
}

// isNull reports whether b, a value an UnmarshalJSON is given, is null:
// encoding/json hands it over rather than leave the field alone, and a
// null (in YAML, a key left blank) must leave an option as it is for any
// other type, at its default, not turn a Size into 0 nor a Duration into
// an error about an empty string.
func isNull(b []byte) bool { return string(b) == "null" }

// Size is a byte count that config files write as 4194304 or "4MiB".
type Size int64

// MarshalJSON writes s the way a person would in a config file: "4MiB" or
// "64KiB" when it is a whole number of those, else an integer.
func (s Size) MarshalJSON() ([]byte, error) {
	str := s.String()
	if str[len(str)-1] == 'B' {
		return []byte(`"` + str + `"`), nil
	}
	return []byte(str), nil
}

// String is s as a config file would write it: "4MiB", or bytes.
func (s Size) String() string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && int64(s)%u.mult == 0 {
			return strconv.FormatInt(int64(s)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// UnmarshalJSON reads an integer or a string with a unit: B, KiB, MiB, GiB
// (powers of 1024) or KB, MB, GB (powers of 1000). A null leaves s as it
// was (isNull).
func (s *Size) UnmarshalJSON(b []byte) error {
	if isNull(b) {
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		switch {
		case n < 0:
			return valueError(reflect.TypeFor[Size](), "size %d must not be negative", n)
		case n > maxSize:
			return valueError(reflect.TypeFor[Size](), "size %d is over the largest a config may hold, %d (2^62)", n, int64(maxSize))
		}
		*s = Size(n)
		return nil
	}
	if integerLiteral(string(b)) { // an integer, beyond an int64
		if b[0] == '-' {
			return valueError(reflect.TypeFor[Size](), "size %s must not be negative", b)
		}
		return valueError(reflect.TypeFor[Size](), "size %s is over the largest a config may hold, %d (2^62)", b, int64(maxSize))
	}
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return valueError(reflect.TypeFor[Size](), `size %s must be an integer or a string such as "4MiB"`, b)
	}
	v, err := ParseSize(str)
	if err != nil {
		return valueError(reflect.TypeFor[Size](), "%s", err.Error())
	}
	*s = Size(v)
	return nil
}

// maxSize bounds every Size, however written, so that each one a config
// can hold also prints as one that parses back ("4294967296GiB").
const maxSize = 1 << 62

// ParseSize parses "4MiB", "64KiB", "1GB" or a plain integer.
func ParseSize(str string) (int64, error) {
	t := strings.TrimSpace(str)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > maxSize/mult {
		return 0, fmt.Errorf(`bad size %q: want a non-negative integer with an optional unit B, KiB, MiB, GiB, KB, MB or GB`, str)
	}
	return n * mult, nil
}
