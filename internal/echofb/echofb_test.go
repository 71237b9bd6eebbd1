package echofb_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	fb "github.com/google/flatbuffers/go"

	"github.com/kernrpc/kernrpc/internal/echofb"
	"github.com/kernrpc/kernrpc/plugins/codec/flatbuffers/fbverify"
)

// The generated code works with the runtime in go.mod: what its builder
// functions write, its accessors read back, after fbverify checked it.
func TestGeneratedCodeReadsWhatItBuilds(t *testing.T) {
	payload := bytes.Repeat([]byte{1, 2, 3}, 1000)
	b := fb.NewBuilder(0)
	p := b.CreateByteVector(payload)
	s := b.CreateString("Zoë")
	echofb.EchoStart(b)
	echofb.EchoAddPayload(b, p)
	echofb.EchoAddText(b, s)
	b.Finish(echofb.EchoEnd(b))

	var e echofb.Echo
	if err := fbverify.InitRoot(&e, b.FinishedBytes()); err != nil {
		t.Fatalf("a buffer the generated code built fails verification: %v", err)
	}
	if string(e.Text()) != "Zoë" || !bytes.Equal(e.PayloadBytes(), payload) || e.PayloadLength() != len(payload) || e.Payload(2) != 3 {
		t.Errorf("read back text %q and %d payload bytes; want Zoë and %d", e.Text(), e.PayloadLength(), len(payload))
	}
}

// Echo.go is what flatc makes of echo.fbs today. Skipped where flatc is not
// installed (apt-get install -y flatbuffers-compiler).
func TestGeneratedCodeIsUpToDate(t *testing.T) {
	if _, err := exec.LookPath("flatc"); err != nil {
		t.Skip("flatc is not installed; cannot regenerate Echo.go to compare")
	}
	out := t.TempDir()
	cmd := exec.Command("flatc", "--go", "--go-namespace", "echofb", "-o", out, "echo.fbs")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("flatc: %v\n%s", err, msg)
	}
	fresh, err := os.ReadFile(filepath.Join(out, "echofb", "Echo.go"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("Echo.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Error("Echo.go differs from what flatc generates from echo.fbs; run go generate ./internal/echofb and commit it")
	}
}
