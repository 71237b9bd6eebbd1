//go:build !linux

package shmring

import (
	"errors"
	"runtime"

	"github.com/kernrpc/kernrpc/kernel"
)

// New fails: shared-memory rings need memfd and SO_PEERCRED.
func New(o *Options) (kernel.Transport, error) {
	return nil, errors.New("shm-ring needs Linux (memfd, SO_PEERCRED); this is " + runtime.GOOS + ": use tcp-lv")
}
