package kernrpc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kernrpc/kernrpc"
	"github.com/kernrpc/kernrpc/internal/echopb"
	"github.com/kernrpc/kernrpc/kernel"
)

// chromium finds a headless-capable Chromium: Debian's package installs
// /usr/bin/chromium (.ci/run installs it). Without one the test skips,
// except under KERNRPC_REQUIRE_TOOLS=1 (CI), where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("KERNRPC_REQUIRE_TOOLS") == "1" {
		t.Fatal("chromium is not installed, and KERNRPC_REQUIRE_TOOLS=1 requires it: apt-get install chromium")
	}
	t.Skip("chromium is not installed (apt-get install chromium); skipping the console's browser test")
	return ""
}

// browse runs headless Chromium on url and returns what it printed: the
// DOM after the page's scripts ran for budget of virtual time (its
// timers run on virtual time; fetches are real), or nothing with a
// screenshot flag among extra.
func browse(t *testing.T, bin, url string, budget time.Duration, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=" + strconv.Itoa(int(budget.Milliseconds())),
	}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
	}
	return stdout.String()
}

var totalCalls = regexp.MustCompile(`id="total-calls">([0-9,]+)<`)

// renderedCalls is the total calls figure the page rendered.
func renderedCalls(t *testing.T, dom string) int {
	t.Helper()
	m := totalCalls.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the page has no total calls figure:\n%.2000s", dom)
	}
	n, err := strconv.Atoi(strings.ReplaceAll(m[1], ",", ""))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConsoleInBrowser loads the console in headless Chromium twice
// while calls flow and checks that the page renders live figures: the
// calls counted, changing between the two reads, the methods table and
// the slowest calls with their trace ids. With
// KERNRPC_CONSOLE_SCREENSHOT=path it also saves a screenshot there
// (docs/console.png is made so).
func TestConsoleInBrowser(t *testing.T) {
	bin := chromium(t)
	srv, cfg := consoleServer(t)
	cli := newClient(t, cfg)
	url := "http://" + srv.AdminAddr() + "/status"

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() {
		ctx := context.Background()
		var resp echopb.Echo
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			method, callCtx := "Echo.Echo", ctx
			switch {
			case i%200 == 0:
				// Slow and traced: the slowest calls show their trace ids.
				method = "Echo.Slow"
				callCtx = kernrpc.WithMetadata(ctx, kernel.Metadata{"traceparent": fmt.Sprintf("00-%032x-00f067aa0ba902b7-01", uint64(0x4bf92f3577b34da6)+uint64(i))})
			case i%50 == 0:
				method = "Echo.Fail"
			case i%300 == 7:
				method = "Echo.Limited"
			}
			_ = cli.Call(callCtx, method, &echopb.Echo{Text: "x"}, &resp)
		}
	})
	time.Sleep(1200 * time.Millisecond) // a whole second of calls in the rate window

	first := browse(t, bin, url, 2*time.Second, "--dump-dom")
	n1 := renderedCalls(t, first)
	time.Sleep(300 * time.Millisecond)
	second := browse(t, bin, url, 2*time.Second, "--dump-dom")
	n2 := renderedCalls(t, second)
	if n1 <= 0 || n2 <= n1 {
		t.Errorf("total calls rendered: %d, then %d; want a figure above 0 that grows while calls flow", n1, n2)
	}
	for _, want := range []string{`data-method="Echo.Echo"`, `data-method="Echo.Fail"`, `NotFound=`, `class="ok">SERVING<`, "token_bucket_tokens", "tcp-lv", "00000000000000004bf92f3577b34da6"} {
		if !strings.Contains(second, want) {
			t.Errorf("the rendered page has no %s", want)
		}
	}
	if m := regexp.MustCompile(`id="total-qps">([0-9.,]+)<`).FindStringSubmatch(second); m == nil || m[1] == "0" {
		t.Errorf("QPS rendered: %v; want a figure above 0", m)
	}
	if m := regexp.MustCompile(`<span id="err">([^<]*)<`).FindStringSubmatch(second); m == nil || m[1] != "" {
		t.Errorf("the page's error line: %v; want it there and empty", m)
	}

	if path := os.Getenv("KERNRPC_CONSOLE_SCREENSHOT"); path != "" {
		abs, err := filepath.Abs(path)
		if err != nil {
			t.Fatal(err)
		}
		browse(t, bin, url, 2*time.Second, "--screenshot="+abs, "--window-size=1280,900", "--hide-scrollbars")
		if png, err := os.ReadFile(abs); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
			t.Errorf("screenshot %s: %v; want a PNG", abs, err)
		}
	}
}
