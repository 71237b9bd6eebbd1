// Package faultharness holds the exactly-one-answer harness of
// docs/reliability.md, in its tests: thousands of concurrent calls through
// the engine over the faulty transport, wrapping tcp-lv and shm-ring, with
// each fault on in turn, checking that every call gets exactly one
// outcome within its deadline, that no call runs twice on the server, and
// that goroutines and file descriptors return to their baseline. The
// package itself is empty; only its tests build anything.
package faultharness
