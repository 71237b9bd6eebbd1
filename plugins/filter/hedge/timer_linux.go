package hedge

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// newClock opens the precise clock's timerfd and starts the goroutine
// that reads it; nil if the kernel refuses one (runtime timers then do).
func newClock() *clock {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	k := &clock{base: time.Now(), fd: fd, file: os.NewFile(uintptr(fd), "hedge-timerfd")}
	go k.run()
	return k
}

// run waits for the timerfd in the poller, until the clock is closed.
func (k *clock) run() {
	var expirations [8]byte
	for {
		if _, err := k.file.Read(expirations[:]); err != nil {
			return // closed; EAGAIN is the poller's to retry
		}
		k.expire()
	}
}

// setLocked sets the timerfd to fire at deadline (ns since base); 0
// disarms it.
func (k *clock) setLocked(deadline, now int64) {
	var spec unix.ItimerSpec
	if deadline != 0 {
		spec.Value = unix.NsecToTimespec(max(deadline-now, 1))
	}
	if unix.TimerfdSettime(k.fd, 0, &spec, nil) == nil {
		k.set = deadline
	}
}
