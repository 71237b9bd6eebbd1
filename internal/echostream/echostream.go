// Package echostream is the echo stream handler the engine's tests, the
// fault harness and the soak register: a package of its own, without
// "testing", so that a command can use it too.
package echostream

import (
	"context"
	"errors"
	"io"

	"github.com/kernrpc/kernrpc"
)

// Serve is a bidirectional stream handler that answers every message with
// itself until the client closes its side.
func Serve[M any](_ context.Context, st kernrpc.ServerStreamOf[M, M]) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(m); err != nil {
			return err
		}
	}
}
