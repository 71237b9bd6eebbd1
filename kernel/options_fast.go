package kernel

import (
	"encoding"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// setFromTree is DecodeOptions' fast path: it sets opts from tree
// directly, without the JSON round trip, which cost a client made for one
// call 20 allocations and some 7% of its CPU time (the memory registry's
// static list, in the harness's short mode). It reports false on anything
// it does not decode exactly as encoding/json would: a key that names no
// field exactly, a null (a nil list or map too), a value of a type no
// config parser makes, a target of an interface type, an array, an
// embedded struct, a ",string" tag, a map key type other than a string
// kind. DecodeOptions then decodes the whole tree through JSON, over what
// this path set: decoding a tree again into what it was decoded into
// changes nothing (scalars are overwritten, pointers and slice elements
// decoded into again, map entries decoded from zero), so the result, or
// the error, is the JSON path's own.
func setFromTree(tree map[string]any, opts any) bool {
	v := reflect.ValueOf(opts)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return false
	}
	return setValue(v.Elem(), tree)
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	numberType          = reflect.TypeFor[json.Number]()
)

// setValue decodes x into v, which is addressable.
func setValue(v reflect.Value, x any) bool {
	if x == nil {
		return false
	}
	if v.Kind() != reflect.Pointer {
		if pt := reflect.PointerTo(v.Type()); pt.Implements(jsonUnmarshalerType) {
			return setUnmarshaler(v.Addr().Interface().(json.Unmarshaler), x)
		} else if pt.Implements(textUnmarshalerType) {
			return false
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return setValue(v.Elem(), x)
	case reflect.Struct:
		return setStruct(v, x)
	case reflect.Map:
		return setMap(v, x)
	case reflect.Slice:
		return setSlice(v, x)
	case reflect.String:
		// encoding/json checks what a json.Number field is given.
		s, ok := x.(string)
		if ok = ok && utf8.ValidString(s) && v.Type() != numberType; ok {
			v.SetString(s)
		}
		return ok
	case reflect.Bool:
		b, ok := x.(bool)
		if ok {
			v.SetBool(b)
		}
		return ok
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := treeInt(x)
		if ok = ok && !v.OverflowInt(n); ok {
			v.SetInt(n)
		}
		return ok
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n, ok := treeUint(x)
		if ok = ok && !v.OverflowUint(n); ok {
			v.SetUint(n)
		}
		return ok
	case reflect.Float64:
		f, ok := treeFloat(x)
		if ok {
			v.SetFloat(f)
		}
		return ok
	}
	return false
}

// setUnmarshaler hands u the JSON the slow path would: x as json.Marshal
// writes it inside the tree.
func setUnmarshaler(u json.Unmarshaler, x any) bool {
	if !plainTreeValue(x) {
		return false
	}
	b, err := json.Marshal(x)
	return err == nil && u.UnmarshalJSON(b) == nil
}

// plainTreeValue reports whether x is one of the scalars a config parser
// makes, which json.Marshal writes as the config said.
func plainTreeValue(x any) bool {
	switch x := x.(type) {
	case string:
		return utf8.ValidString(x)
	case bool, int, int64, uint64:
		return true
	case float64:
		return !math.IsNaN(x) && !math.IsInf(x, 0)
	case json.Number:
		return jsonNumber(string(x))
	}
	return false
}

func setStruct(v reflect.Value, x any) bool {
	m, ok := x.(map[string]any)
	if !ok || m == nil { // a nil map is written as null
		return false
	}
	for key, e := range m {
		i, ok := fieldFor(v.Type(), key)
		if !ok || !setValue(v.Field(i), e) {
			return false
		}
	}
	return true
}

// fieldFor finds the field of struct type t that encoding/json decodes
// key into, where key is the field's name exactly. It reports false too
// for a struct whose naming this path leaves to encoding/json: one with
// an embedded field, a tag name encoding/json would ignore, or two fields
// of key's name; and for a field with the ",string" option.
func fieldFor(t reflect.Type, key string) (int, bool) {
	found := -1
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			return 0, false
		}
		tag := f.Tag.Get("json")
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if !plainTagName(name) {
			return 0, false
		}
		if name == "" {
			name = f.Name
		}
		if name != key {
			continue
		}
		if found >= 0 || hasOption(opts, "string") {
			return 0, false
		}
		found = i
	}
	return found, found >= 0
}

func hasOption(opts, want string) bool {
	for opts != "" {
		var o string
		o, opts, _ = strings.Cut(opts, ",")
		if o == want {
			return true
		}
	}
	return false
}

// plainTagName reports whether name is one encoding/json takes as it is
// (letters, digits, '_', '-', '.'), or empty.
func plainTagName(name string) bool {
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func setMap(v reflect.Value, x any) bool {
	m, ok := x.(map[string]any)
	kt := v.Type().Key()
	if !ok || m == nil || kt.Kind() != reflect.String || reflect.PointerTo(kt).Implements(textUnmarshalerType) {
		return false
	}
	if v.IsNil() {
		v.Set(reflect.MakeMapWithSize(v.Type(), len(m)))
	}
	et := v.Type().Elem()
	for key, e := range m {
		if !utf8.ValidString(key) {
			return false
		}
		elem := reflect.New(et).Elem()
		if !setValue(elem, e) {
			return false
		}
		v.SetMapIndex(reflect.ValueOf(key).Convert(kt), elem)
	}
	return true
}

// setSlice decodes a list as encoding/json does: into the slice's own
// elements (those past its length but within its capacity too), then into
// new ones, then cut to the list's length.
func setSlice(v reflect.Value, x any) bool {
	list, ok := x.([]any)
	if !ok || list == nil { // a nil list is written as null
		return false
	}
	for i, e := range list {
		if i >= v.Cap() {
			v.Grow(1)
		}
		if i >= v.Len() {
			v.SetLen(i + 1)
		}
		if !setValue(v.Index(i), e) {
			return false
		}
	}
	if len(list) < v.Len() {
		v.SetLen(len(list))
	}
	if len(list) == 0 {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0))
	}
	return true
}

// exactFloat is the largest magnitude below which every integer a float64
// holds prints, and parses, as itself.
const exactFloat = 1 << 53

func treeInt(x any) (int64, bool) {
	switch x := x.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case float64:
		return int64(x), x == math.Trunc(x) && math.Abs(x) < exactFloat
	case json.Number:
		n, err := strconv.ParseInt(string(x), 10, 64)
		return n, err == nil && jsonNumber(string(x))
	}
	return 0, false
}

func treeUint(x any) (uint64, bool) {
	switch x := x.(type) {
	case int:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	case uint64:
		return x, true
	case float64:
		// JSON writes -0.0 as -0, which encoding/json refuses an unsigned.
		return uint64(x), x == math.Trunc(x) && !math.Signbit(x) && x < exactFloat
	case json.Number:
		n, err := strconv.ParseUint(string(x), 10, 64)
		return n, err == nil && jsonNumber(string(x))
	}
	return 0, false
}

func treeFloat(x any) (float64, bool) {
	switch x := x.(type) {
	case int:
		return float64(x), int64(x) > -exactFloat && int64(x) < exactFloat
	case int64:
		return float64(x), x > -exactFloat && x < exactFloat
	case uint64:
		return float64(x), x < exactFloat
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return f, err == nil && jsonNumber(string(x))
	}
	return 0, false
}

// jsonNumber reports whether s is a number as JSON writes one, which
// json.Marshal requires of a json.Number.
func jsonNumber(s string) bool {
	i := 0
	digits := func() int {
		start := i
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i++
		}
		return i - start
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	if n := digits(); n == 0 || n > 1 && s[i-n] == '0' {
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}
