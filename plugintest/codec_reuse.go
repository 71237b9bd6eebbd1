package plugintest

import (
	"reflect"

	"github.com/kernrpc/kernrpc/kernel"
)

// codecStale is what the suite fills a reused target's strings with.
const codecStale = "plugintest: stale"

// codecReuse decodes the sample into targets that already hold other
// values, as a caller reusing one reply value across calls does, and
// expects exactly the sample each time: Unmarshal replaces what v held.
func codecReuse(t tb, c kernel.Codec, s CodecSample, samples []CodecSample) {
	data, err := c.Marshal(nil, s.Value)
	if err != nil {
		t.Fatalf("Marshal(nil, %T): %v", s.Value, err)
	}
	const hint = "Unmarshal must replace what v holds, not merge into it (reset v first: proto.Reset, " +
		"or set the value v points to to its zero value)"

	// A target the suite filled in itself: every kind of field holds
	// something the sample's encoding must replace or clear.
	if filled := s.New(); codecFill(reflect.ValueOf(filled), 0) {
		before := codecShow(filled)
		if got, ok := codecDecodeInto(t, c, s, data, filled); ok && !codecEqual(s, s.Value, got) {
			t.Errorf("Unmarshal of sample %q into a target already holding %s left %s, want %s; %s",
				s.Name, before, codecShow(got), codecShow(s.Value), hint)
		}
	}
	// A target holding each other sample of the same type.
	for _, o := range samples {
		if o.Name == s.Name || reflect.TypeOf(o.New()) != reflect.TypeOf(s.New()) {
			continue
		}
		odata, err := c.Marshal(nil, o.Value)
		if err != nil {
			continue // RoundTrip reports it
		}
		target := s.New()
		if p := codecCatch(func() error { return c.Unmarshal(odata, target) }); p.panicked || p.err != nil {
			continue // RoundTrip reports it
		}
		if got, ok := codecDecodeInto(t, c, s, data, target); ok && !codecEqual(s, s.Value, got) {
			t.Errorf("Unmarshal of sample %q into a target holding sample %q left %s, want %s; %s",
				s.Name, o.Name, codecShow(got), codecShow(s.Value), hint)
		}
	}
	// The zero value, which encodes no field at all, into a target
	// holding the sample: nothing of the sample may remain.
	zero, ok := codecZero(s)
	if !ok {
		return // Empty reports it
	}
	zdata, err := c.Marshal(nil, zero)
	if err != nil {
		return // Empty reports it
	}
	target := s.New()
	if _, ok := codecDecodeInto(t, c, s, data, target); !ok {
		return
	}
	if got, ok := codecDecodeInto(t, c, s, zdata, target); ok && !codecEqual(s, zero, got) {
		t.Errorf("Unmarshal of the zero value's encoding %s into a target holding sample %q left %s, want the zero value %s; %s",
			codecHex(zdata), s.Name, codecShow(got), codecShow(zero), hint)
	}
}

// codecDecodeInto unmarshals data into target, failing t on a panic or an
// error, and returns target.
func codecDecodeInto(t tb, c kernel.Codec, s CodecSample, data []byte, target any) (any, bool) {
	t.Helper()
	return codecDecodeWith(t, "Unmarshal", c.Unmarshal, CodecSample{New: func() any { return target }, Name: s.Name}, data)
}

// codecFill sets every exported field reachable from v to a value other
// than its zero value: strings to codecStale, numbers to 7, slices and
// maps to one element, pointers to a filled new value. It reports whether
// it set anything.
func codecFill(v reflect.Value, depth int) bool {
	if depth > 4 {
		return false
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			return codecFill(v.Elem(), depth+1)
		}
		if !v.CanSet() {
			return false
		}
		nv := reflect.New(v.Type().Elem())
		if !codecFill(nv.Elem(), depth+1) {
			return false
		}
		v.Set(nv)
		return true
	case reflect.Struct:
		set := false
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && codecFill(v.Field(i), depth+1) {
				set = true
			}
		}
		return set
	case reflect.Array:
		set := false
		for i := range v.Len() {
			set = codecFill(v.Index(i), depth+1) || set
		}
		return set
	}
	if !v.CanSet() {
		return false
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(codecStale)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(7.5)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			v.SetBytes([]byte(codecStale))
			return true
		}
		s := reflect.MakeSlice(v.Type(), 1, 1)
		codecFill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		key := reflect.New(v.Type().Key()).Elem()
		switch key.Kind() {
		case reflect.String:
			key.SetString(codecStale)
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			key.SetInt(77)
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			key.SetUint(77)
		default:
			return false
		}
		elem := reflect.New(v.Type().Elem()).Elem()
		codecFill(elem, depth+1)
		m := reflect.MakeMapWithSize(v.Type(), 1)
		m.SetMapIndex(key, elem)
		v.Set(m)
	default:
		return false
	}
	return true
}
