package kernrpc

// Hooks the engine's external tests (package kernrpc_test) reach in.

// SetWatchLapseHook makes h run as a connection's watchdog is about to
// lapse (nil: nothing).
func SetWatchLapseHook(h func()) {
	if h == nil {
		watchLapseHook.Store(nil)
		return
	}
	watchLapseHook.Store(&h)
}
