// This file reads config files: YAML or JSON into the tree parseTree takes.

package kernrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// LoadConfig reads a config file, YAML (.yaml, .yml) or JSON (.json), and
// parses it with kernel.ParseConfig: ${VAR} and ${VAR:-default} are
// expanded, KERNRPC_ADDRESS and KERNRPC_ADVERTISE override the addresses,
// and unknown keys or wrong types are errors naming the key and the file.
// A file must hold one document, and no mapping may repeat a key.
func LoadConfig(path string) (*Config, error) {
	if _, err := parserFor(path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("kernrpc: config file %s does not exist: pass -config with the path of a kernrpc.yaml "+
			"(see examples/echo/kernrpc.yaml): %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("kernrpc: config: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig parses a config held in memory (an embedded file, say) as
// LoadConfig parses a file; source names it in errors and its extension
// picks YAML or JSON.
func ParseConfig(data []byte, source string) (*Config, error) {
	parse, err := parserFor(source)
	if err != nil {
		return nil, err
	}
	tree, err := parse(data)
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("kernrpc: %s: at byte %d: %w", source, se.Offset, err)
		}
		return nil, fmt.Errorf("kernrpc: %s: %w", source, err)
	}
	return parseTree(tree, source)
}

func parserFor(path string) (func([]byte) (map[string]any, error), error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".yaml", ".yml":
		return parseYAML, nil
	case ".json":
		return parseJSON, nil
	default:
		return nil, fmt.Errorf("kernrpc: config %s: unknown extension %q; name the file .yaml, .yml or .json", path, ext)
	}
}

// parseYAML decodes one YAML document into the tree kernel.ParseConfig
// takes: maps with string keys, []any, and JSON-like scalars. yaml.v3
// itself rejects a key repeated in one mapping.
func parseYAML(data []byte) (map[string]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return map[string]any{}, nil // an empty file: every default
		}
		var te *yaml.TypeError // e.g. a repeated key: one line per problem
		if errors.As(err, &te) {
			return nil, fmt.Errorf("yaml: %s", strings.Join(te.Errors, "; "))
		}
		return nil, err
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("after the first document: %w", err)
		}
		return nil, errors.New("holds more than one YAML document (a second --- line); a config file is one document")
	}
	if doc == nil {
		return map[string]any{}, nil // only comments, or an explicit null
	}
	v, err := normalize(doc, "")
	if err != nil {
		return nil, err
	}
	tree, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("top level is %s; want a mapping of keys such as service, address, transport", describe(doc))
	}
	return tree, nil
}

// normalize turns what yaml.v3 decodes into the JSON-shaped values that
// kernel.DecodeOptions accepts. path is the key path, for errors.
func normalize(v any, path string) (any, error) {
	switch t := v.(type) {
	case nil, bool, string, int, int64, uint64:
		return t, nil
	case float64:
		if math.IsInf(t, 0) || math.IsNaN(t) {
			return nil, fmt.Errorf("key %q: %v is not a number a config can use", path, t)
		}
		return t, nil
	case time.Time:
		return nil, fmt.Errorf("key %q: YAML read %s as a timestamp; quote it if it is a string", path, t.Format(time.RFC3339))
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			x, err := normalize(e, join(path, k))
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case map[any]any:
		// yaml.v3 makes this only when some key is not a string.
		out := make(map[string]any, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("key %v under %q is %s, not a string; quote it (\"%v\")", k, pathOrTop(path), describe(k), k)
			}
			x, err := normalize(e, join(path, ks))
			if err != nil {
				return nil, err
			}
			out[ks] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			x, err := normalize(e, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	return nil, fmt.Errorf("key %q: unsupported YAML value of type %T", path, v)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func pathOrTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

func describe(v any) string {
	switch v.(type) {
	case []any:
		return "a list"
	case string:
		return "a string"
	case int, int64, uint64, float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("a %T", v)
}

// parseJSON decodes one JSON object, rejecting repeated keys and anything
// after the object, which encoding/json would silently accept. Numbers stay
// json.Number, as in kernel.ParseConfigJSON.
func parseJSON(data []byte) (map[string]any, error) {
	// A byte order mark, which some editors write: RFC 8259 lets a parser
	// ignore it, and the YAML parser does.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if errors.Is(err, io.EOF) {
		return map[string]any{}, nil // an empty file: every default
	}
	if err != nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("top level is not a JSON object; want {\"service\": ..., \"transport\": ...}")
	}
	tree, err := jsonObject(dec, "")
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("data after the top-level object at offset %d; a config file is one JSON object", dec.InputOffset())
	}
	return tree, nil
}

// jsonObject reads the members of an object whose '{' was just read.
func jsonObject(dec *json.Decoder, path string) (map[string]any, error) {
	out := map[string]any{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string) // the decoder only yields string keys in objects
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("key %q appears twice", join(path, key))
		}
		v, err := jsonValue(dec, join(path, key))
		if err != nil {
			return nil, err
		}
		out[key] = v
	}
	_, err := dec.Token() // '}'
	return out, err
}

func jsonValue(dec *json.Decoder, path string) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		return jsonObject(dec, path)
	case json.Delim('['):
		list := []any{}
		for i := 0; dec.More(); i++ {
			v, err := jsonValue(dec, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := dec.Token() // ']'
		return list, err
	}
	return tok, nil // string, json.Number, bool or nil
}
