//go:build linux

package tcplv

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The OS TCP keepalive covers what Pings do not, idle connections
// (doc.go): both sides enable it with keepalive_interval as the idle time
// and the probe interval, up to Linux's largest (32767 s: above it the
// kernel refuses both and the system's 2 h idle time stays), and leave the
// probe count to the system.
func TestOSKeepaliveOnBothSides(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		want     int
	}{{7 * time.Second, 7}, {12 * time.Hour, 32767}} {
		t.Run(tc.interval.String(), func(t *testing.T) { testOSKeepalive(t, tc.interval, tc.want) })
	}
}

func testOSKeepalive(t *testing.T, interval time.Duration, wantSeconds int) {
	probes, err := os.ReadFile("/proc/sys/net/ipv4/tcp_keepalive_probes")
	if err != nil {
		t.Skipf("no system probe count to compare with: %v", err)
	}
	wantProbes, err := strconv.Atoi(strings.TrimSpace(string(probes)))
	if err != nil {
		t.Fatal(err)
	}
	client, server := connPair(t, keepaliveOptions(interval, time.Second))
	for side, c := range map[string]*conn{"client": client, "server": server} {
		sc, err := c.raw.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got [4]int
		var errs [4]error
		if err := sc.Control(func(fd uintptr) {
			for i, opt := range [][2]int{
				{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
				{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
			} {
				got[i], errs[i] = syscall.GetsockoptInt(int(fd), opt[0], opt[1])
			}
		}); err != nil {
			t.Fatal(err)
		}
		for _, err := range errs {
			if err != nil {
				t.Fatalf("%s: getsockopt: %v", side, err)
			}
		}
		if want := [4]int{1, wantSeconds, wantSeconds, wantProbes}; got != want {
			t.Errorf("%s: SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT = %v; want %v", side, got, want)
		}
	}
}
