package shmring

import (
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the transport's config name.
const Name = "shm-ring"

// Factory builds shm-ring transports from config; init registers it. On
// systems other than Linux, New fails with an error saying so.
var Factory = kernel.NewFactory[kernel.Transport](Name,
	"same-host calls through a shared-memory ring pair per client (Linux): zero-copy, Unix socket for attach, wake-ups and liveness",
	DefaultOptions, New)

func init() { kernel.RegisterTransport(Factory) }

// Options configure an shm-ring transport; the package doc lists the
// defaults.
type Options struct {
	// RingSize is the size of each of a client's two rings (requests,
	// answers), a power of two. A listener uses the smaller of its own and
	// the one a dialing client proposes.
	RingSize kernel.Size `json:"ring_size"`
	// MaxFrameSize bounds the length field of frames read and written.
	MaxFrameSize kernel.Size `json:"max_frame_size"`
	// Spin is the longest a side waiting for the peer polls the ring
	// before it sleeps; 0 never polls.
	Spin kernel.Duration `json:"spin"`
	// WaitTimeout bounds how long a writer waits for ring space before its
	// frame fails with ResourceExhausted, and how long a client's attach
	// handshake may take the server (a client's dial is bounded by its
	// context).
	WaitTimeout kernel.Duration `json:"wait_timeout"`
	// MaxMetadataEntries and MaxMetadataBytes bound the metadata of one
	// frame, read or written.
	MaxMetadataEntries int         `json:"max_metadata_entries"`
	MaxMetadataBytes   kernel.Size `json:"max_metadata_bytes"`
	// AllowUIDs are the user ids, besides this process's own effective
	// one (SO_PEERCRED reports a peer's effective uid), whose
	// processes may attach (server side) or be attached to (client side).
	AllowUIDs []uint32 `json:"allow_uids"`
	// Logger receives the reasons connections are closed; nil means
	// slog.Default(). Code only: config files cannot set it.
	Logger *slog.Logger `json:"-"`
}

// DefaultOptions returns the options a config without an options block gets.
func DefaultOptions() *Options {
	return &Options{
		RingSize:     4 << 20,
		MaxFrameSize: kernel.DefaultMaxFrameSize,
		Spin:         kernel.Duration(50 * time.Microsecond),
		WaitTimeout:  kernel.Duration(5 * time.Second),

		MaxMetadataEntries: kernel.DefaultMaxMetadataEntries,
		MaxMetadataBytes:   kernel.DefaultMaxMetadataBytes,
	}
}

const (
	// minRingSize keeps a reserved record (256 bytes of headers) well
	// inside the largest record, a quarter ring.
	minRingSize = 16 << 10
	maxRingSize = 1 << 30
	// maxSpin bounds polling: on a machine with two cores, a side that polls
	// longer takes a core the peer may need to produce what it waits for.
	maxSpin = time.Millisecond
	// maxLengthField is the largest value the 32-bit length prefix can hold.
	maxLengthField = 1<<32 - 1
)

func optionError(key, format string, args ...any) error {
	return fmt.Errorf("shm-ring: option %q: "+format, append([]any{key}, args...)...)
}

func (o *Options) validate() error {
	if o.RingSize < minRingSize || o.RingSize > maxRingSize || bits.OnesCount64(uint64(o.RingSize)) != 1 {
		return optionError("ring_size", "must be a power of two between 16KiB and 1GiB, got %d", int64(o.RingSize))
	}
	if o.MaxFrameSize < kernel.FrameFixedLen || o.MaxFrameSize > maxLengthField {
		return optionError("max_frame_size", "must be between %d and %d bytes (the length field is 32 bits), got %d",
			kernel.FrameFixedLen, int64(maxLengthField), int64(o.MaxFrameSize))
	}
	if o.Spin < 0 || o.Spin.D() > maxSpin {
		return optionError("spin", "must be between 0 and %s (polling longer starves the peer of a core), got %s", maxSpin, o.Spin)
	}
	if o.WaitTimeout <= 0 {
		return optionError("wait_timeout", "must be positive, got %s", o.WaitTimeout)
	}
	if o.MaxMetadataEntries < 1 {
		return optionError("max_metadata_entries", "must be at least 1, got %d", o.MaxMetadataEntries)
	}
	if o.MaxMetadataBytes < 1 {
		return optionError("max_metadata_bytes", "must be at least 1 byte, got %d", int64(o.MaxMetadataBytes))
	}
	return nil
}
