package kernel

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// fuzzOptions has a field of every kind plugin options use.
type fuzzOptions struct {
	Size   Size              `json:"size"`
	Window Duration          `json:"window"`
	Codes  []Code            `json:"codes"`
	Name   string            `json:"name"`
	Count  int               `json:"count"`
	Ratio  float64           `json:"ratio"`
	On     bool              `json:"on"`
	Tags   []string          `json:"tags"`
	Labels map[string]string `json:"labels"`
	Sizes  map[string]Size   `json:"sizes"`
	Nested *fuzzOptions      `json:"nested"`
	Inline struct {
		Key string `json:"key"`
	} `json:"inline"`
}

// FuzzDecodeOptions decodes any JSON object as a plugin's options block,
// the way the plugin table does with a config file's tree. DecodeOptions
// and encoding/json alone give the same options, or the same error, with
// the tree's numbers as a JSON config's parser and a YAML one's make
// them (checkSameAsJSON). An error for
// a wrong key or value names that key (which may be "", a key a config
// can spell); what decodes is written back as a
// config would show it and decodes again to the same options, so that a
// value never reads one way and prints another.
func FuzzDecodeOptions(f *testing.F) {
	for _, seed := range []string{
		`{"size":"4MiB","window":"250ms","codes":["unavailable",14],"name":"x","count":3,"ratio":0.5,"on":true}`,
		`{"tags":["a"],"labels":{"k":"v"},"sizes":{"a":"1KB","b":7},"nested":{"size":1},"inline":{"key":"k"}}`,
		`{"size":9223372036854775807}`, `{"size":9223372035781033984}`, `{"size":"4611686018427387904B"}`, `{"size":-1}`, `{"size":"1.5MiB"}`,
		`{"window":"-5s"}`, `{"window":5}`, `{"window":0}`, `{"codes":["NOPE"]}`, `{"unknown":1}`,
		`{"nested":{"nested":{"unknown":true}}}`, `{"count":1e400}`, `{"count":"3"}`,
		`{"size":99999999999999999999}`, `{"size":-99999999999999999999}`, `{"unsigned":-0.0}`,
		`{"small":-3,"unsigned":9,"ratio":2.5,"limit":"1s","rules":[{"code":"internal","next":{"tries":1}},{}],"by_name":{"kept":{"tries":2}}}`,
		`{"rules":[],"tags":["a"],"bytes":[1,2],"Untagged":"u","quoted":"5","folded":"f","inner":{"own":"o"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tree, ok := decodeTree(data)
		if !ok {
			return // not an options block: the config parser refuses it first
		}
		checkSameAsJSON(t, tree)
		checkSameAsJSON(t, yamlShaped(tree).(map[string]any))
		var opts fuzzOptions
		if err := DecodeOptions(tree, &opts); err != nil {
			var de *decodeError
			if !errors.As(err, &de) {
				t.Fatalf("%s: error names no key: %v", data, err)
			}
			return
		}
		shown, err := json.Marshal(&opts)
		if err != nil {
			t.Fatalf("%s decoded to %+v, which does not encode: %v", data, opts, err)
		}
		again, ok := decodeTree(shown)
		if !ok {
			t.Fatalf("%s shown as %s, which is no JSON object", data, shown)
		}
		var back fuzzOptions
		if err := DecodeOptions(again, &back); err != nil || !reflect.DeepEqual(back, opts) {
			t.Fatalf("%s decoded to %+v, shown as %s, read back as %+v (%v)", data, opts, shown, back, err)
		}
	})
}

// decodeTree parses a JSON object keeping its numbers exact, as a YAML
// config's integers are.
func decodeTree(data []byte) (tree map[string]any, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return tree, dec.Decode(&tree) == nil && tree != nil
}
