//go:build !linux

package main

// uname is empty where the system offers no uname(2) through package
// syscall; the report then names the system by GOOS.
func uname() string { return "" }
