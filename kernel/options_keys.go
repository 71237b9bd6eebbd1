package kernel

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// A key of a config tree, found where encoding/json meets it.
type treeKey struct {
	path  string       // "server.shutdown_timeot", "filters[1].sied"
	in    reflect.Type // the struct whose mapping holds it
	field string       // the field's name it matches but for case, or ""
}

// firstKey walks v, a tree decoded into a t, as encoding/json does (a
// mapping's keys in sorted order, depth first), and returns the first key
// of a struct's mapping that pick takes, given the key, the name of the
// field it matches (exactly, or else but for case; "" if none) and
// whether the match is exact.
func firstKey(v any, t reflect.Type, path string, pick func(key, field string, exact bool) bool) (treeKey, bool) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		return treeKey{}, false
	}
	switch t.Kind() {
	case reflect.Struct:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, field, exact, _ := jsonField(t, k)
			if pick(k, field, exact) {
				return treeKey{path: joinKey(path, k), in: t, field: field}, true
			}
			if field == "" {
				continue
			}
			if found, ok := firstKey(m[k], ft, joinKey(path, k), pick); ok {
				return found, true
			}
		}
	case reflect.Map:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if found, ok := firstKey(m[k], t.Elem(), joinKey(path, k), pick); ok {
				return found, true
			}
		}
	case reflect.Slice, reflect.Array:
		list, _ := v.([]any)
		for i, e := range list {
			if found, ok := firstKey(e, t.Elem(), path+"["+strconv.Itoa(i)+"]", pick); ok {
				return found, true
			}
		}
	}
	return treeKey{}, false
}

// jsonField finds the field of struct t that encoding/json decodes key
// into: the one named key exactly, else one whose name matches it but for
// case. It returns the field's type and name, "" if there is none, and
// how a type error's Field spells it (at: embedded structs' names first).
func jsonField(t reflect.Type, key string) (ft reflect.Type, name string, exact bool, at string) {
	for _, f := range optionFields(t) {
		if f.name == key {
			return f.typ, f.name, true, f.at
		}
		if name == "" && strings.EqualFold(f.name, key) {
			ft, name, at = f.typ, f.name, f.at
		}
	}
	return ft, name, false, at
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// badValueKey finds in v, a tree decoded into a t, the first value (in
// encoding/json's order) that lies at fields, the struct fields' names
// joined by "." as a *json.UnmarshalTypeError's Field gives them, and
// does not decode into its field, and returns its path: the same names
// with the list indices and map keys that lead to it ("rules[1].tries").
// path and at are v's own path, in both spellings.
func badValueKey(v any, t reflect.Type, path, at, fields string) (string, bool) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || fields == "" {
		return "", false
	}
	if at == fields {
		if decodesInto(v, t) {
			return "", false
		}
		return badElement(v, t, path), true
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		return "", false
	}
	switch t.Kind() {
	case reflect.Struct:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if ft, field, _, fat := jsonField(t, k); field != "" {
				if found, ok := badValueKey(m[k], ft, joinKey(path, k), joinKey(at, fat), fields); ok {
					return found, true
				}
			}
		}
	case reflect.Map:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if found, ok := badValueKey(m[k], t.Elem(), joinKey(path, k), at, fields); ok {
				return found, true
			}
		}
	case reflect.Slice, reflect.Array:
		list, _ := v.([]any)
		for i, e := range list {
			if found, ok := badValueKey(e, t.Elem(), path+"["+strconv.Itoa(i)+"]", at, fields); ok {
				return found, true
			}
		}
	}
	return "", false
}

// badElement narrows path, a value v that does not decode into a t, to
// the first element of a list or map in it that does not decode: a
// value's type error is reported at its field, whichever element holds it.
func badElement(v any, t reflect.Type, path string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		return path
	}
	switch t.Kind() {
	case reflect.Map:
		if m, ok := v.(map[string]any); ok {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				if !decodesInto(m[k], t.Elem()) {
					return badElement(m[k], t.Elem(), joinKey(path, k))
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if list, ok := v.([]any); ok {
			for i, e := range list {
				if !decodesInto(e, t.Elem()) {
					return badElement(e, t.Elem(), path+"["+strconv.Itoa(i)+"]")
				}
			}
		}
	}
	return path
}

// decodesInto reports whether v decodes into a t without a type error;
// unknown keys, which are not type errors, are left to firstKey.
func decodesInto(v any, t reflect.Type) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	var te *json.UnmarshalTypeError
	return !errors.As(json.Unmarshal(b, reflect.New(t).Interface()), &te)
}

// unmarshalerKey finds in v, a tree decoded into a t, the first value (in
// encoding/json's order) whose type's UnmarshalJSON refuses it with the
// message msg, and returns its path.
func unmarshalerKey(v any, t reflect.Type, path, msg string) (string, bool) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "", false
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshalerType) {
		b, err := json.Marshal(v)
		if err != nil {
			return "", false
		}
		err = reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(b)
		return path, err != nil && err.Error() == msg
	}
	switch t.Kind() {
	case reflect.Struct:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if ft, field, _, _ := jsonField(t, k); field != "" {
				if found, ok := unmarshalerKey(m[k], ft, joinKey(path, k), msg); ok {
					return found, true
				}
			}
		}
	case reflect.Map:
		m, _ := v.(map[string]any)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if found, ok := unmarshalerKey(m[k], t.Elem(), joinKey(path, k), msg); ok {
				return found, true
			}
		}
	case reflect.Slice, reflect.Array:
		list, _ := v.([]any)
		for i, e := range list {
			if found, ok := unmarshalerKey(e, t.Elem(), path+"["+strconv.Itoa(i)+"]", msg); ok {
				return found, true
			}
		}
	}
	return "", false
}
