package main

import "syscall"

// uname describes the kernel: system, release and machine.
func uname() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	return utsString(u.Sysname[:]) + " " + utsString(u.Release[:]) + " " + utsString(u.Machine[:])
}

func utsString[T int8 | uint8](field []T) string {
	var b []byte
	for _, c := range field {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
