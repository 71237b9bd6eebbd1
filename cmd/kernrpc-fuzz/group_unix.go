//go:build unix

package main

import (
	"os/exec"
	"syscall"
	"time"
)

// ownGroup runs cmd in a process group of its own and makes the end of
// its context interrupt the whole group. go test leaves an interrupt to
// the test binary, which a terminal's Ctrl-C reaches with the rest of the
// foreground group: killing the go command alone, exec's default, orphans
// the test binary and its fuzzing workers, which fuzz on until -fuzztime
// with the output pipe still open. A group still running grace after the
// interrupt is killed. release ends that wait once cmd is done.
func ownGroup(cmd *exec.Cmd, grace time.Duration) (release func()) {
	done := make(chan struct{})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		pgid := cmd.Process.Pid
		go func() {
			select {
			case <-time.After(grace):
				syscall.Kill(-pgid, syscall.SIGKILL)
			case <-done:
			}
		}()
		return syscall.Kill(-pgid, syscall.SIGINT)
	}
	return func() { close(done) }
}
