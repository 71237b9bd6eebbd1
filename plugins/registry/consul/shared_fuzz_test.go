package consul

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzDecodeShared reads arbitrary values found under the shared prefix:
// kernrpc's records and whatever another program wrote there. What it
// accepts has a writer, an expiry and a value, and reads back the same
// after being written again, so that a shared entry does not change as it
// passes through Consul.
func FuzzDecodeShared(f *testing.F) {
	rec, err := json.Marshal(sharedRecord{Writer: "0123456789abcdef", Expires: 1_800_000_000_000, Value: []byte("open until")})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"writer":"w","expires":1,"value":""}`))
	f.Add([]byte(`{"writer":"w","expires":1,"value":null}`))
	f.Add([]byte(`{"writer":"","expires":1,"value":"AA=="}`))
	f.Add([]byte(`{"writer":"w","expires":-5,"value":"AA=="}`))
	f.Add([]byte(`{"writer":"w","expires":1e30,"value":"AA=="}`))
	f.Add([]byte(`{"writer":"w","expires":1,"value":"not base64"}`))
	f.Add([]byte(`leader`))
	f.Add([]byte(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeShared(data)
		if err != nil {
			return
		}
		if got.Writer == "" || got.Expires <= 0 || got.Value == nil {
			t.Fatalf("decodeShared(%q) accepted %+v: a record needs a writer, an expiry and a value", data, got)
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("writing back %+v: %v", got, err)
		}
		back, err := decodeShared(again)
		if err != nil || back.Writer != got.Writer || back.Expires != got.Expires || !bytes.Equal(back.Value, got.Value) {
			t.Fatalf("%q read back as %+v, %v; want %+v", again, back, err, got)
		}
	})
}
