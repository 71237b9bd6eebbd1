package main

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The example's story must stay true.
func TestStreamingExample(t *testing.T) {
	var out bytes.Buffer
	o, err := run(context.Background(), &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if want := []string{"event 0", "event 1", "event 2", "event 3", "event 4"}; !slices.Equal(o.events, want) || o.trailer != "5" {
		t.Errorf("Feed.Watch gave %q with trailer %q; want %q and 5", o.events, o.trailer, want)
	}
	if want := []string{"HELLO", "STREAMS SHARE", "ONE CONNECTION", "BYE"}; !slices.Equal(o.answers, want) {
		t.Errorf("Chat.Upper answered %q, want %q", o.answers, want)
	}
	// 1 KiB events against a 64 KiB window: the server stops after about
	// 64 of the 1000 while the client reads none.
	if o.sentPaused == 0 || o.sentPaused > o.window/1000+2 {
		t.Errorf("server sent %d events while the client read none; the %d-byte window allows about %d", o.sentPaused, o.window, o.window/1000)
	}
}
