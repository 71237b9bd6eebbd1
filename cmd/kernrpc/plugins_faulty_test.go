package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// The faulty transport is a built-in plugin users name in their test
// configs, so the command lists it with its options.
func TestPluginsListsFaulty(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"plugins", "-v"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"transport  faulty", `"reset_after":0`, `"corrupt_in":"payload"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plugins output lacks %q:\n%s", want, out.String())
		}
	}
}
