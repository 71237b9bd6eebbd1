//go:build !unix

package main

import (
	"os/exec"
	"time"
)

// ownGroup leaves cmd as exec makes it where there are no process groups:
// the end of its context kills the go command.
func ownGroup(cmd *exec.Cmd, grace time.Duration) (release func()) { return func() {} }
