//go:build !linux

package shmring

import (
	"strings"
	"testing"
)

func TestNeedsLinux(t *testing.T) {
	if _, err := New(DefaultOptions()); err == nil || !strings.Contains(err.Error(), "shm-ring needs Linux") {
		t.Fatalf("New on a system without shm-ring: %v", err)
	}
}
