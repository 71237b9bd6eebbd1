//go:build !linux

package kernrpc

// memoryLimit finds no container limit outside Linux.
func memoryLimit() (limit int64, ok bool) { return 0, false }
